"""nixl.logging: NIXL's logging set-up for Python code, as upstream's
examples use it::

    from nixl.logging import get_logger
    logger = get_logger(__name__)
    logger.info("...")

The public names are upstream's: ``get_logger``, ``setup_logging``,
``set_log_level_by_env`` and ``LOGGING_CONFIG``. ``get_logger(name)`` configures
the ``nixl`` logger once (a handler on stdout, level INFO, not propagating to
the root logger) and returns ``nixl.<name without leading underscores>``.
Environment variables, as upstream reads them:

- ``NIXL_LOG_LEVEL``: TRACE, DEBUG, INFO, WARN, ERROR or FATAL (any case)
  overrides the ``nixl`` logger's level; another value is reported as a
  warning and the configured level stays.
- ``NIXL_DEBUG_LOGGING``: true/1/yes sets ``logging.raiseExceptions`` (errors
  inside logging calls raise instead of being printed).

Ferry's addition, not upstream's: ``native_logger()``, the logger for the
messages that NIXL's C++ core prints (the metadata listener's
``MD listener is listening on port N`` and the side channel's errors). Like
NIXL's C++ log it writes to stderr, its threshold is NIXL_LOG_LEVEL with WARN
as the default, and its lines end with the message, so scripts that grep NIXL's
stderr (``awk '/MD listener is listening on port/ { print $NF }'``) find ours.
"""

from __future__ import annotations

import logging
import logging.config
import os
import sys
import threading

# NIXL_LOG_LEVEL's values and the Python level each one means.
_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}

# Handed to logging.config.dictConfig by setup_logging(); callers may edit it
# before their first get_logger() call, as with upstream's.
LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "simpleFormatter": {
            "format": "%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d %(message)s",
            "datefmt": "%Y-%m-%d %H:%M:%S",
        },
    },
    "handlers": {
        "consoleHandler": {
            "class": "logging.StreamHandler",
            "level": "INFO",
            "formatter": "simpleFormatter",
            "stream": "ext://sys.stdout",
        },
    },
    "loggers": {
        "nixl": {"level": "INFO", "handlers": ["consoleHandler"], "propagate": False},
    },
}

_logging_configured = False
_setup_lock = threading.Lock()


def set_log_level_by_env(nixl_logger: logging.Logger) -> None:
    """Sets ``nixl_logger``'s level from NIXL_LOG_LEVEL, if that is set; a value
    that is not a NIXL level is logged as a warning and changes nothing."""
    value = os.getenv("NIXL_LOG_LEVEL")
    if not value:
        return
    level = _LEVELS.get(value.upper())
    if level is None:
        nixl_logger.warning(
            "Invalid NIXL_LOG_LEVEL value '%s': not one of %s. Using configuration default.",
            value, ", ".join(_LEVELS))
        return
    nixl_logger.setLevel(level)
    nixl_logger.info("Log level set to %s from NIXL_LOG_LEVEL environment variable",
                     value.upper())


def setup_logging() -> None:
    """Configures the ``nixl`` logger from LOGGING_CONFIG and the environment;
    only the first call does anything."""
    global _logging_configured
    with _setup_lock:
        if _logging_configured:
            return
        logging.config.dictConfig(LOGGING_CONFIG)
        set_log_level_by_env(logging.getLogger("nixl"))
        logging.raiseExceptions = (
            os.getenv("NIXL_DEBUG_LOGGING", "").lower() in ("true", "1", "yes"))
        _logging_configured = True


def get_logger(name: str) -> logging.Logger:
    """The logger ``nixl.<name>`` with leading underscores dropped
    (``get_logger("_api")`` is ``nixl.api``), after setup_logging()."""
    setup_logging()
    return logging.getLogger("nixl." + name.lstrip("_"))


# --- Ferry: the stand-in for NIXL's C++ log (not part of upstream's module) ---

NATIVE_LOGGER_NAME = "nixl.native"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of each record (so that a
    redirected or captured stderr gets the lines)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def _native_level() -> int:
    value = os.getenv("NIXL_LOG_LEVEL", "")
    return _LEVELS.get(value.upper(), logging.WARNING)


_native_configured = False


def native_logger() -> logging.Logger:
    """The logger of messages NIXL's C++ core would print: stderr, threshold
    NIXL_LOG_LEVEL (default WARN, as NIXL's C++ log), one line per record in the
    style ``I0312 10:11:12.345 140213 _channel.py:88] message``. Configured on
    first use; it does not propagate (so the stdout handler of the ``nixl``
    logger does not print its records a second time)."""
    global _native_configured
    log = logging.getLogger(NATIVE_LOGGER_NAME)
    with _setup_lock:
        if not _native_configured:
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter(
                "%(levelname).1s%(asctime)s.%(msecs)03d %(thread)d %(filename)s:%(lineno)d] "
                "%(message)s", datefmt="%m%d %H:%M:%S"))
            log.addHandler(handler)
            log.setLevel(_native_level())
            log.propagate = False
            value = os.getenv("NIXL_LOG_LEVEL")
            if value and value.upper() not in _LEVELS:
                log.warning("Invalid NIXL_LOG_LEVEL environment variable, using default log "
                            "level: WARN")
            _native_configured = True
    return log


__all__ = ["LOGGING_CONFIG", "get_logger", "set_log_level_by_env", "setup_logging"]
