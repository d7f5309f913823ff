"""The sentences users read when a policy stops them (docs/design.md §6 wording)."""

from __future__ import annotations


def context_limit_message(tokens: int, limit: int) -> str:
    """E.g. "This chat has reached 9,120 tokens, over your limit of 8,192. Please start a new
    chat." (thousands separators, as docs/design.md §6 words it)."""
    return (f"This chat has reached {tokens:,} tokens, over your limit of {limit:,}. "
            "Please start a new chat.")


def turn_limit_message(turns: int, limit: int) -> str:
    """E.g. "This chat has reached 41 turns, over your limit of 40. Please start a new chat." """
    return (f"This chat has reached {turns:,} turns, over your limit of {limit:,}. "
            "Please start a new chat.")


def concurrency_message(active: int, limit: int) -> str:
    """Too many requests of this user at once."""
    noun = "request" if active == 1 else "requests"
    return (f"You already have {active:,} {noun} running, your limit is {limit:,}. "
            "Please wait for one to finish.")


def daily_quota_message(used: int, limit: int) -> str:
    """This user's tokens for today are spent."""
    return (f"You have used {used:,} tokens today, your daily limit is {limit:,}. "
            "It resets at midnight UTC.")
