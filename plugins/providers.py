"""Built-in providers: Anthropic (default), OpenAI-compatible endpoints, and scripted."""

from __future__ import annotations

from pathlib import Path

from roost import LazyProvider, LLMProvider, ProviderSpec, Settings, hookimpl

DEMO_SCRIPT = Path(__file__).with_name("demo_script.yaml")


def _anthropic(settings: Settings) -> LLMProvider:
    # The SDK takes over a second to import: load it off the start path.
    def build() -> LLMProvider:
        from plugins.anthropic_provider import AnthropicProvider

        return AnthropicProvider(settings)

    return LazyProvider("anthropic", build)


def _openai(settings: Settings) -> LLMProvider:
    def build() -> LLMProvider:
        from plugins.openai_provider import OpenAIProvider

        return OpenAIProvider(settings)

    return LazyProvider("openai", build)


def _scripted(settings: Settings) -> LLMProvider:
    from plugins.scripted_provider import ScriptedProvider

    return ScriptedProvider.from_file(settings.script or DEMO_SCRIPT)


def _anthropic_missing(settings: Settings) -> str | None:
    if settings.anthropic_api_key is None:
        return ("no LLM credentials: set ANTHROPIC_API_KEY (or ROOST_PROVIDER=openai with "
                "OPENAI_BASE_URL for a local model, or run `roost chat --demo`)")
    return None


def _openai_missing(settings: Settings) -> str | None:
    if settings.openai_base_url is None and settings.openai_api_key is None:
        return ("the openai provider needs OPENAI_BASE_URL (for example "
                "http://127.0.0.1:11434/v1 for Ollama) or OPENAI_API_KEY")
    return None


def _scripted_missing(settings: Settings) -> str | None:
    path = settings.script or DEMO_SCRIPT
    if path.is_file():
        return None
    return f"the scripted provider needs ROOST_SCRIPT; {path} is missing"


@hookimpl
def roost_providers(settings: Settings) -> list[ProviderSpec]:
    """The providers that ship with Roost."""
    return [
        ProviderSpec("anthropic", _anthropic, _anthropic_missing),
        ProviderSpec("openai", _openai, _openai_missing),
        ProviderSpec("scripted", _scripted, _scripted_missing),
    ]
