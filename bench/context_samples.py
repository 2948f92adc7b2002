"""Context bench part 3, its sample: text of each kind the token estimator is measured on."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence

from bench.context_content import (
    PROMPT_CATEGORY,
    _csv_output,
    _json_output,
    _log_output,
    _page_output,
)
from bench.context_first import FirstRequest

# -- part 3: token estimator error ---------------------------------------------------

ENGLISH_CHAT = (
    "hey, can you remind me what we decided about the staging deploy on friday?",
    "Sure! On Friday you decided to postpone the staging deploy until Priya has reviewed the "
    "database migration. You also asked me to ping you on Monday morning if the review "
    "still wasn't done.",
    "ok thanks. also what's a good way to politely decline a meeting invite without sounding "
    "rude? it's a recurring 'sync' that's mostly status updates I could just read in slack",
    "A few options that stay friendly:\n\n- **Offer an alternative:** \"I'll skip the live "
    "sync for now and catch up from the notes. Feel free to tag me if anything needs my "
    "input.\"\n- **Be explicit about focus time:** \"I'm protecting Tuesday mornings for "
    "deep work, so I'll follow along async.\"\n- **Ask for the update in writing:** \"Could "
    "we post the status in #team-updates instead? I'd still like to follow along.\"\n\nIf "
    "it's your manager's meeting, it's worth a quick word first so the decline doesn't "
    "come as a surprise.",
    "lol yes that works. can u make it shorter",
    "Can you add 'renew passport' to my todo list for next week and remind me the "
    "appointment is at 9:30 on Tuesday?",
    "Done: I added \"Renew passport (appointment Tue 9:30)\" to todo.md under next week. I "
    "can't send reminders on my own, but I'll mention it whenever you check your list.",
    "The cheapest option is the 07:45 train from Leeds, arriving in London King's Cross at "
    "10:02. It costs £38.50 with a railcard (£58.20 without). The 08:15 is faster (2h 05m) "
    "but costs £71. Both let you cancel for a £10 fee until the day before.",
    "What's the difference between a Roth IRA and a traditional IRA, in two sentences?",
    "The main thing with sourdough is patience. Feed your starter the night before so it's "
    "bubbly and roughly doubled in the morning, then mix 500 g of flour with 350 g of water "
    "and let it rest for 30 minutes before adding 100 g of starter and 10 g of salt. Do "
    "three or four sets of stretch-and-folds, 30 minutes apart, then let the dough rise "
    "until it's grown by about half. Shape it, put it in the fridge overnight, and bake it "
    "straight from the fridge at 250 °C in a covered pot for 20 minutes, then uncovered for "
    "another 20-25 minutes until it's deep brown.",
)

CODE = (
    '''def parse_duration(text: str) -> int:
    """Seconds in a duration like '1h30m' or '45s'."""
    total = 0
    for amount, unit in re.findall(r"(\\d+)([hms])", text):
        total += int(amount) * {"h": 3600, "m": 60, "s": 1}[unit]
    if total == 0:
        raise ValueError(f"not a duration: {text!r}")
    return total
''',
    '''export function useDebounce<T>(value: T, delayMs = 300): T {
  const [debounced, setDebounced] = useState(value);
  useEffect(() => {
    const timer = setTimeout(() => setDebounced(value), delayMs);
    return () => clearTimeout(timer);
  }, [value, delayMs]);
  return debounced;
}
''',
    '''SELECT c.id, c.name, COUNT(o.id) AS orders, SUM(o.total_cents) / 100.0 AS revenue
FROM customers c
LEFT JOIN orders o ON o.customer_id = c.id AND o.created_at >= NOW() - INTERVAL '30 days'
WHERE c.archived_at IS NULL
GROUP BY c.id, c.name
HAVING COUNT(o.id) > 0
ORDER BY revenue DESC
LIMIT 20;
''',
    '''#!/usr/bin/env bash
set -euo pipefail
for f in logs/*.log; do
  errors=$(grep -c ' ERROR ' "$f" || true)
  if [[ "$errors" -gt 0 ]]; then
    echo "$(basename "$f"): $errors errors"
  fi
done | sort -t: -k2 -nr | head -n 10
''',
    '''func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
\tctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
\tdefer cancel()
\tif err := s.db.PingContext(ctx); err != nil {
\t\thttp.Error(w, "database unavailable", http.StatusServiceUnavailable)
\t\treturn
\t}
\tw.Header().Set("Content-Type", "application/json")
\t_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
}
''',
    '''FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml ./
RUN pip install --no-cache-dir .
COPY . .
USER 1000
EXPOSE 8080
CMD ["gunicorn", "-w", "4", "-b", "0.0.0.0:8080", "app:create_app()"]
''',
    '''name: ci
on: [push, pull_request]
jobs:
  test:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        python: ["3.11", "3.12", "3.13"]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: ${{ matrix.python }}
      - run: pip install -e '.[dev]' && pytest -q
''',
    '''impl Cache {
    pub fn get_or_insert(&mut self, key: &str, make: impl FnOnce() -> Vec<u8>) -> &[u8] {
        if !self.entries.contains_key(key) {
            let value = make();
            self.bytes += value.len();
            self.entries.insert(key.to_owned(), value);
            self.evict_if_needed();
        }
        &self.entries[key]
    }
}
''',
    '''Traceback (most recent call last):
  File "/srv/app/jobs/export.py", line 142, in run
    rows = await fetch_rows(conn, job.query, limit=job.limit)
  File "/srv/app/jobs/export.py", line 88, in fetch_rows
    async with conn.transaction():
  File "/usr/lib/python3.12/site-packages/asyncpg/transaction.py", line 62, in __aenter__
    await self.start()
asyncpg.exceptions.TooManyConnectionsError: sorry, too many clients already
''',
    '''--- a/app/settings.py
+++ b/app/settings.py
@@ -12,7 +12,9 @@ class Settings(BaseSettings):
     database_url: str = "postgresql://localhost/app"
-    pool_size: int = 5
+    pool_size: int = 20
+    pool_timeout: float = 10.0
+    """Seconds to wait for a free connection before failing the request."""
     log_level: str = "INFO"
''',
)

EUROPEAN = (
    "Hallo! Kannst du mir bitte helfen, eine kurze E-Mail an meinen Vermieter zu schreiben? "
    "Die Heizung in der Küche funktioniert seit drei Tagen nicht mehr, und ich möchte "
    "fragen, wann ein Techniker vorbeikommen kann.",
    "Ich habe mir die Zahlen aus dem letzten Quartal angesehen. Der Umsatz ist im Vergleich "
    "zum Vorjahr um zwölf Prozent gestiegen, aber die Kosten für Logistik und Lagerhaltung "
    "sind deutlich schneller gewachsen. Wir sollten bis Ende des Monats klären, ob sich ein "
    "zweites Lager in Süddeutschland lohnt oder ob wir die Lieferverträge neu verhandeln.",
    "Bonjour ! Peux-tu me rappeler à quelle heure part le train pour Lyon demain matin ? Je "
    "crois que c'était vers sept heures et quart, mais je ne suis plus sûr.",
    "Merci pour le résumé. J'aimerais ajouter une remarque : le client a demandé que la "
    "livraison soit avancée d'une semaine, ce qui risque de compliquer le planning de "
    "l'équipe technique. Est-ce que tu peux préparer une réponse polie qui explique les "
    "contraintes sans fermer la porte ?",
    "¡Hola! ¿Me puedes ayudar a planificar una cena para ocho personas el sábado? Dos son "
    "vegetarianos y uno es alérgico a los frutos secos.",
    "El informe está casi listo, pero todavía faltan los datos de ventas de la región norte. "
    "Según el equipo, los tendrán mañana por la tarde. ¿Crees que deberíamos enviar una "
    "versión preliminar al director o esperar a tener todo completo?",
    "Ciao! Mi ricordi cosa devo comprare per la festa di compleanno di Giulia? Mi sembra che "
    "avessimo parlato di palloncini, candeline e una torta al cioccolato senza glutine.",
    "Olá! Você pode me ajudar a organizar minha agenda da semana? Tenho reuniões na segunda "
    "e na quarta de manhã, consulta médica na quinta à tarde e preciso entregar o relatório "
    "até sexta-feira.",
    "Goedemorgen! Kun je een korte samenvatting maken van het artikel dat ik gisteren heb "
    "gestuurd? Ik heb vanmiddag een overleg en wil de belangrijkste punten paraat hebben.",
    "Cześć! Czy możesz mi przypomnieć, kiedy mam wizytę u dentysty? Wydaje mi się, że to "
    "było w przyszły czwartek o szesnastej, ale nie jestem pewien.",
)

CJK = (
    "你好！能帮我总结一下这周的会议记录吗？我主要想知道哪些任务还没有完成，以及谁负责跟进。",
    "我们计划下个月去成都旅行，大概待五天。第一天想去看大熊猫基地，第二天去宽窄巷子和人民公园喝茶。"
    "请帮我推荐一些当地的特色小吃，最好是不太辣的，因为我父母不太能吃辣。另外，从机场到市中心坐地铁方便吗？",
    "明日の午後三時に歯医者の予約があるので、リマインダーを設定してもらえますか？"
    "それと、帰りにスーパーで牛乳と卵を買うのを忘れないようにメモしておいてください。",
    "このエラーの原因がわかりません。ログを見ると、データベースへの接続がタイムアウトしているようですが、"
    "設定ファイルは昨日から変更していません。ネットワークの問題でしょうか、それともサーバー側の負荷が原因でしょうか？",
    "안녕하세요! 다음 주 화요일에 팀 회의가 있는데, 발표 자료를 준비하는 것을 도와주실 수 있나요? "
    "주제는 지난 분기 매출 분석입니다.",
    "어제 주문한 책이 아직 도착하지 않았어요. 배송 조회를 해보니 물류 센터에서 이틀째 멈춰 있다고 "
    "나오는데, 고객센터에 어떻게 문의하면 좋을까요?",
    "部署完成后，接口的平均响应时间从两百毫秒上升到了八百毫秒。我检查了数据库的慢查询日志，"
    "发现有一条没有使用索引的查询。你觉得应该先加索引，还是先回滚这次发布？",
    "来週の出張の準備をしています。大阪のホテルを二泊予約して、新幹線の時間も確認しておいてもらえますか？"
    "会議は水曜日の午前十時からです。",
)

OTHER_SCRIPTS = (
    "Привет! Напомни, пожалуйста, что мы обсуждали на прошлой неделе насчёт переезда офиса. "
    "Я забыл, к какому числу нужно освободить помещение и кто отвечает за перевозку мебели.",
    "Сервер перестал отвечать около трёх часов ночи. В логах видно, что память закончилась, "
    "и процесс был завершён системой. Я перезапустил его вручную, но хочу понять, почему "
    "потребление памяти так резко выросло. Можешь посмотреть графики за последние сутки и "
    "предложить, что проверить в первую очередь?",
    "Доброго ранку! Чи можеш ти скласти короткий список справ на сьогодні? Мені потрібно "
    "зателефонувати до банку, забрати посилку на пошті та підготувати звіт для керівника до "
    "п'ятої вечора.",
    "Звіт за минулий місяць майже готовий, але бракує даних про продажі в західному регіоні. "
    "Колеги обіцяли надіслати їх завтра зранку, тож остаточну версію я зможу відправити до "
    "обіду.",
    "مرحباً، هل يمكنك مساعدتي في كتابة رسالة بريد إلكتروني إلى مديري أطلب فيها إجازة لمدة "
    "ثلاثة أيام الأسبوع القادم بسبب ظروف عائلية؟",
    "وصلتني فاتورة الكهرباء لهذا الشهر وهي أعلى بكثير من المعتاد. هل يمكنك مساعدتي في "
    "مقارنتها بفواتير الأشهر الثلاثة الماضية ومعرفة سبب هذه الزيادة؟",
    "שלום! אני מחפש מתכון פשוט לארוחת ערב שאפשר להכין בפחות מחצי שעה, בלי בשר. יש לי בבית "
    "עגבניות, בצל, אורז וקצת גבינה.",
    "הפגישה עם הלקוח נדחתה ליום חמישי בשעה עשר בבוקר. אפשר לעדכן את היומן ולשלוח לכל "
    "המשתתפים הודעה קצרה על השינוי?",
    "नमस्ते! क्या आप मुझे कल की बैठक के लिए एक छोटा सा एजेंडा बनाने में मदद कर सकते हैं? "
    "हमें बजट, नई भर्ती और अगले महीने की योजना पर चर्चा करनी है।",
    "मेरे लैपटॉप की बैटरी बहुत जल्दी खत्म हो रही है, खासकर जब मैं वीडियो कॉल पर होता हूँ। "
    "क्या आप कुछ आसान उपाय बता सकते हैं जिससे बैटरी ज़्यादा देर तक चले?",
)


def sample(first: Sequence[FirstRequest]) -> dict[str, list[str]]:
    """The measured sample, by category. Tool outputs use part 1's generators.

    Items come in pairs of one kind (language, generator) where possible, so the
    even (calibration) and odd (measured) halves cover the same kinds.
    """
    sizes = (600, 1_200, 2_500, 4_000, 6_000, 800, 1_500, 3_000, 5_000, 8_000)

    def outputs(make: Callable[[random.Random, int], str], seed: int) -> list[str]:
        return [make(random.Random(seed + i), size) for i, size in enumerate(sizes)]

    prompts = [r.request.system + "\n" + "\n".join(
        f"{t.name} {t.description} {json.dumps(dict(t.input_schema))}" for t in r.request.tools)
        for r in first]
    return {
        "English chat": list(ENGLISH_CHAT),
        "code": list(CODE),
        "JSON tool output": outputs(_json_output, 1_000),
        "log tool output": outputs(_log_output, 2_000),
        "CSV tool output": outputs(_csv_output, 3_000),
        "Markdown page output": outputs(_page_output, 4_000),
        "de/fr/es/it/pt/nl/pl": list(EUROPEAN),
        "zh/ja/ko": list(CJK),
        "ru/uk/ar/he/hi": list(OTHER_SCRIPTS),
        PROMPT_CATEGORY: prompts,
    }
