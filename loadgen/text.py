"""Seeded filler text: chat questions, pasted documents, long system prompts.

Plain common English words, so any tokenizer sees roughly one token per word (we budget
TOKENS_PER_WORD to stay under a server's context limit; the true counts come from usage).
"""

from __future__ import annotations

import random

TOKENS_PER_WORD = 1.3  # a cautious upper estimate for BPE tokenizers on common words

_WORDS = (
    "the office team meeting report budget quarter client project plan schedule email draft "
    "review summary table figure result customer order invoice payment policy holiday manager "
    "colleague printer coffee kitchen desk window server network password account document "
    "contract proposal deadline target sales market product price cost revenue growth risk "
    "issue update change request approval decision question answer idea note list item week "
    "month year morning afternoon today tomorrow yesterday please thanks could would should "
    "will can need want know think make take give send check write read find help show tell "
    "new old good better best small large long short early late first last next other same "
    "and or but so because if when while after before about with from into over under for"
).split()

_TOPICS = [
    "the quarterly sales report", "a polite reply to a late invoice", "the new holiday policy",
    "how to share a printer on the network", "a plan for the client workshop",
    "a summary of the budget meeting", "three ideas for the team newsletter",
    "the risks in the product launch", "a short agenda for Monday", "a checklist for new staff",
]


def words(rng: random.Random, n: int) -> str:
    """n random words in sentences of 8-16 words."""
    out: list[str] = []
    while len(out) < n:
        k = min(rng.randint(8, 16), n - len(out))
        sentence = [rng.choice(_WORDS) for _ in range(k)]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        out.extend(sentence)
    return " ".join(out)


def question(rng: random.Random, min_words: int = 10, max_words: int = 60) -> str:
    """A chat turn: an ask about an office topic plus some context."""
    topic = rng.choice(_TOPICS)
    return f"Please help me with {topic}. " + words(rng, rng.randint(min_words, max_words))


def document(rng: random.Random, tokens: int) -> str:
    """A pasted document of about `tokens` tokens, with a request to summarise it."""
    body = words(rng, max(1, int(tokens / TOKENS_PER_WORD)))
    return f"Summarise this document for the team:\n\n{body}"


def system_prompt(tokens: int, seed: int = 0) -> str:
    """The long shared system prompt of the shared-prefix scenario (same for every user)."""
    rng = random.Random(f"system-{seed}")
    return ("You are the office assistant. Follow the house rules below. "
            + words(rng, max(1, int(tokens / TOKENS_PER_WORD))))


_NAMES = ("total", "count", "price", "order", "client", "invoice", "budget", "report",
          "amount", "rate", "item", "line", "week", "month", "user", "score")
_OPS = ("+", "-", "*")


def source_file(rng: random.Random, tokens: int) -> str:
    """A Python module of about `tokens` tokens: small functions over office numbers (code
    tokenizes at about two tokens per word-like piece, so it is sized by characters)."""
    functions: list[str] = []
    chars = 0
    while chars < tokens * 3:  # ~3 characters per token for code
        name = f"{rng.choice(_NAMES)}_{rng.choice(_NAMES)}_{len(functions)}"
        a, b = rng.sample(_NAMES, 2)
        lines = [f"def {name}({a}, {b}):",
                 f'    """Return the {a} and the {b} combined for the {rng.choice(_NAMES)}."""']
        for i in range(rng.randint(1, 3)):
            lines.append(f"    step_{i} = {a} {rng.choice(_OPS)} {b} {rng.choice(_OPS)} "
                         f"{rng.randint(1, 99)}")
        lines.append(f"    return step_{i}")
        body = "\n".join(lines)
        functions.append(body)
        chars += len(body) + 2
    return "\n\n\n".join(functions) + "\n"


def code_edit(rng: random.Random, tokens: int) -> str:
    """A request to rewrite a file with one small change: the reply repeats the file."""
    source = source_file(rng, tokens)
    old = source.split("def ", 2)[1].split("(", 1)[0]
    return (f"Rename the function `{old}` to `{old}_v2` in this file. Reply with the whole "
            f"file, changed, and nothing else.\n\n```python\n{source}```")


_TOOLS = ("read_file", "write_file", "run_tests", "search_code", "list_directory")


def agent_instructions(tokens: int, seed: int = 0) -> str:
    """A coding agent's long system prompt (the same for every agent of a run): its rules
    and its tools, then the house rules as filler up to about `tokens`."""
    rng = random.Random(f"agent-{seed}")
    tools = "\n".join(f"- {name}(path: str, text: str | None): {words(rng, 12)}"
                      for name in _TOOLS)
    head = ("You are a coding agent working in a repository. Reply with exactly one tool "
            'call as JSON, {"tool": NAME, "args": {...}}, and nothing else.\nTools:\n'
            + tools + "\nRules: ")
    return head + words(rng, max(1, int(tokens / TOKENS_PER_WORD) - len(head.split())))


def tool_result(rng: random.Random, n_words: int) -> str:
    """A tool's output as the agent's next user turn: a command's result and some lines."""
    tool = rng.choice(_TOOLS)
    return f"Result of {tool}:\n{words(rng, n_words)}\nWhat is the next tool call?"
