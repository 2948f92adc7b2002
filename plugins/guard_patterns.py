"""The built-in prompt-injection patterns for the input guard.

They flag, they do not judge: in the default ``warn`` mode a match is only
logged. Patterns stay narrow so ordinary chat ("ignore my last message")
does not trip them.
"""

from __future__ import annotations

from roost import GuardPattern, Settings, hookimpl

PATTERNS = [
    GuardPattern(
        "ignore_instructions",
        r"\b(ignore|disregard|forget|override)\s+(all\s+|any\s+|the\s+|your\s+)*"
        r"(previous|prior|above|earlier|preceding|system)\s+"
        r"(instructions?|prompts?|rules|directives|messages?)",
        "asks the model to drop the instructions it was given",
    ),
    GuardPattern(
        "role_override",
        r"\b(you\s+are\s+now|from\s+now\s+on,?\s+you\s+are|act\s+as\s+if\s+you\s+(are|were)|"
        r"pretend\s+(to\s+be|you\s+are))\s+(a|an|the|my)?\s*(new|different|unrestricted|"
        r"jailbroken|evil|DAN)\b",
        "tries to give the model a different identity",
    ),
    GuardPattern(
        "system_tags",
        r"<\|?(im_start|im_end|system|endoftext)\|?>|\[/?SYSTEM\]|<<\s*/?SYS\s*>>|"
        r"</?system>|(^|\n)\s*\[INST\]|\[INST\][\s\S]*\[/INST\]",
        "fake chat-template or system tags",
    ),
    GuardPattern(
        "instruction_injection",
        r"(^|\n)\s*(new|updated|real|actual)\s+(system\s+)?instructions?\s*:|"
        r"(^|\n)\s*(system\s+)?override\s*:",
        "inserts a block of 'new instructions'",
    ),
    GuardPattern("null_bytes", r"\x00", "null bytes, used to hide or split content"),
    GuardPattern(
        "delimiter_escape",
        r"\b(end\s+of\s+(the\s+)?(system\s+)?(prompt|instructions|context))\s*[.!:;\]\-—]|"
        r"</(instructions|prompt|context|user_input)>",
        "claims the instructions ended to start a new context",
    ),
    GuardPattern(
        "role_delimiter",
        r"</\s*(user|human|user_?input|input|query)\s*>[\s\S]{0,40}?"
        r"<\s*(assistant|system|model|ai|bot)\s*>|<\|\s*(assistant|user|system)\s*\|>|"
        r"(^|\n)\s*\n\s*(human|assistant)\s*:\s*\S",
        "closes the user's turn and opens the assistant's with chat-template delimiters",
    ),
]


@hookimpl
def roost_guard_patterns(settings: Settings) -> list[GuardPattern]:
    """The spec's six detection patterns, plus role-delimiter escapes."""
    return PATTERNS
