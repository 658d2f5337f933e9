"""Errors a user can cause. Every message names the field, the value and the rule."""

from __future__ import annotations

from typing import Any


class SeqparError(ValueError):
    """A user-caused error; the CLI prints it on one line and exits 2."""


class ConfigError(SeqparError):
    """A configuration value breaks a rule."""

    def __init__(self, field: str, value: Any, rule: str):
        self.field, self.value, self.rule = field, value, rule
        super().__init__(f"{field}={value!r}: {rule}")


def require(ok: bool, field: str, value: Any, rule: str) -> None:
    """Raise ConfigError(field, value, rule) unless ok."""
    if not ok:
        raise ConfigError(field, value, rule)
