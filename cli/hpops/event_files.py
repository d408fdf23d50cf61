"""Saved events (`hpops twin send EVENT.json ...`), read and checked before anything runs.

A file holds one JSON object or a non-empty list of them. An object with a "detail-type" is an
EventBridge event (it goes through the rules); any other object is a state machine input (started
directly, like events/repair-dry-run.json). Every problem is a CliError naming the file and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hpops.errors import CliError

# EventBridge refuses a PutEvents entry of 256 KB or more; Step Functions an execution input over 256 KB.
EVENT_LIMIT_BYTES = 256 * 1024
EXPECTED = "a JSON object (an event or a state machine input) or a non-empty list of them"
_KINDS = {bool: "true/false", int: "a number", float: "a number", str: "a string", type(None): "null",
          list: "a list", dict: "an object"}


def load_event_files(paths: Iterable[str], *, size_limit: int | None = EVENT_LIMIT_BYTES) -> list[dict]:
    """Every event of every file, in order. ``size_limit`` None: sizes are left to the caller."""
    return [event for path in paths for event in load_event_file(path, size_limit=size_limit)]


def load_event_file(path: str, *, size_limit: int | None = EVENT_LIMIT_BYTES) -> list[dict]:
    loaded = _parse(path)
    events = loaded if isinstance(loaded, list) else [loaded]
    if isinstance(loaded, list) and not loaded:
        raise CliError(f"{path}: holds an empty list; expected {EXPECTED}")
    for number, event in enumerate(events, 1):
        where = f"{path}: item {number} of {len(events)}" if isinstance(loaded, list) else path
        if not isinstance(event, dict):
            raise CliError(f"{where} is {_KINDS.get(type(event), type(event).__name__)}; expected {EXPECTED}")
        if size_limit is not None:
            _check_size(where, event, size_limit)
    return events


def put_events_entry_size(entry: dict) -> int:
    """The size EventBridge limits, of one PutEvents entry ("Calculating Amazon EventBridge
    PutEvents event entry size"): Time counts 14 bytes; Source, DetailType, Detail and each
    Resources entry their UTF-8 bytes."""
    size = 14 if entry.get("Time") is not None else 0
    for name in ("Source", "DetailType", "Detail"):
        size += len((entry.get(name) or "").encode("utf-8"))
    return size + sum(len(r.encode("utf-8")) for r in entry.get("Resources") or [] if r is not None)


def entry_of(event: dict) -> dict:
    """The PutEvents entry an event envelope came from (its Detail as compact JSON)."""
    detail = event.get("detail")
    return {"Time": event.get("time"), "Source": event.get("source"), "DetailType": event.get("detail-type"),
            "Detail": None if detail is None else json.dumps(detail, separators=(",", ":"), ensure_ascii=False),
            "Resources": event.get("resources") or []}


def event_size(event: dict) -> int:
    """The size AWS limits: an event's PutEvents entry, or a state machine input's UTF-8 JSON."""
    if "detail-type" not in event:
        return len(json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    return put_events_entry_size(entry_of(event))


def _check_size(where: str, event: dict, limit: int) -> None:
    size = event_size(event)
    if "detail-type" in event and size >= limit:
        raise CliError(f"{where}: event entry is {size:,} bytes; EventBridge takes entries under {limit:,} "
                       "(256 KB): trim its detail")
    if "detail-type" not in event and size > limit:
        raise CliError(f"{where}: state machine input is {size:,} bytes; Step Functions takes at most {limit:,} "
                       "(256 KB): trim it")


def _parse(path: str) -> Any:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise CliError(f"{path}: no such file: give the path of a saved event (such as events/sweep.json)") from None
    except OSError as error:
        raise CliError(f"{path}: cannot read it ({error.strerror or type(error).__name__}): "
                       "give a readable JSON file") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CliError(f"{path}: not UTF-8 text (byte {error.start:,}): save it as UTF-8 JSON") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CliError(f"{path}: invalid JSON at line {error.lineno}, column {error.colno} ({error.msg}): "
                       "fix the file") from None
