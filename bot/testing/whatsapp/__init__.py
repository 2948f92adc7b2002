"""A local fake of the WhatsApp Cloud API (Graph API) and of Meta's webhook sender.

Both sides of WhatsApp, in the documented shapes:

* the **Graph API** the channel calls, under :attr:`FakeWhatsApp.base_url`
  (``WHATSAPP_API_BASE``): ``POST /{phone}/messages`` (text, interactive reply
  buttons, reactions, media by id, templates, and the read receipt with its
  typing indicator), ``POST /{phone}/media`` (multipart upload), ``GET /{media-id}``
  (a short-lived download URL) and the download itself, each checking the bearer
  token (190 otherwise). The fake keeps WhatsApp's rules: free-form messages only
  within 24 hours of the person's last message (131047 otherwise, judged on
  :attr:`FakeWhatsApp.clock`), at most 3 buttons with titles of 20 characters,
  4,096 characters of text;
* the **webhook sender**: :meth:`FakeWhatsApp.text`, :meth:`FakeWhatsApp.media`,
  :meth:`FakeWhatsApp.reaction`, :meth:`FakeWhatsApp.press` build deliveries,
  :meth:`FakeWhatsApp.deliver` POSTs one signed (``X-Hub-Signature-256``) to
  :attr:`FakeWhatsApp.webhook_url` and, like Meta, delivers it again while the
  answer is not a 2xx.

**Faults** (:meth:`FakeWhatsApp.fail`), the ways the real API fails: ``"131047"``,
``"130429"`` (throughput), ``"131056"`` (pair rate limit), ``"502"`` (an HTML page
from the proxy), ``"reset"`` (the connection dropped before the call took
effect), ``"hold"`` (the call is held unanswered and not applied until the
client goes away); :meth:`FakeWhatsApp.expire_urls` makes every download URL
handed out so far answer 404, as WhatsApp's do after five minutes.
"""

from bot.testing.whatsapp.server import Call, FakeWhatsApp, fake_whatsapp

__all__ = ["Call", "FakeWhatsApp", "fake_whatsapp"]
