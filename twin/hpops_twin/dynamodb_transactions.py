"""moto's TransactWriteItems with a rollback that copies only the items a transaction names.

moto 5 deep-copies every table a transaction names before it writes, so that a cancelled
transaction can put the tables back. The cost grows with the table and is paid on every
transaction: a month of usage reports (hundreds of transactions on a table of thousands of items)
spent most of the demo's CPU in that copy. The twin runs moto's own transaction code (the same
checks, writes and errors) and keeps, instead, a copy of each item the transaction names: a
cancelled transaction restores those items as they were, which is everything it could have changed
(DynamoDB's all or nothing). A table with a stream keeps moto's whole copy (the copy also takes back
the stream records of a cancelled write).
"""

from __future__ import annotations

import copy
import threading
import types
from typing import Any
from unittest import mock

from moto.dynamodb import models as dynamodb_models
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.table import Table

_moto_transact_write_items = DynamoDBBackend.transact_write_items
_items_only = threading.local()  # set while this thread's transaction keeps item copies


def _deepcopy(value: Any, memo: dict | None = None) -> Any:
    """copy.deepcopy as moto's dynamodb models call it: a table named by a transaction that keeps
    item copies is not copied (the rollback below restores its items instead)."""
    if isinstance(value, Table) and getattr(_items_only, "active", False):
        return value
    return copy.deepcopy(value, memo)


_COPY = types.SimpleNamespace(deepcopy=_deepcopy, copy=copy.copy)


def _named_items(backend: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> list[tuple[Table, Any, Any, Any]] | None:
    """(table, hash key, range key, a copy of the item or None) for each item the transaction names;
    None if it names a table with a stream, or one that does not exist (moto answers that itself)."""
    named = []
    for entry in transact_items:
        for operation in entry.values():
            table = backend.tables.get(operation.get("TableName")) if isinstance(operation, dict) else None
            if table is None or table.stream_shard is not None:
                return None
            keys = operation.get("Key") or operation.get("Item") or {}
            try:
                hash_key, range_key = backend.get_keys_value(table, keys)
            except Exception:  # a malformed key: moto refuses the transaction before it writes
                continue
            item = table.get_item(hash_key, range_key)
            named.append((table, hash_key, range_key, copy.deepcopy(item)))
    return named


def _restore(named: list[tuple[Table, Any, Any, Any]]) -> None:
    for table, hash_key, range_key, item in reversed(named):
        if range_key is None:
            table.items.pop(hash_key, None)
            if item is not None:
                table.items[hash_key] = item
        else:
            table.items[hash_key].pop(range_key, None)
            if item is not None:
                table.items[hash_key][range_key] = item
            elif not table.items[hash_key]:
                del table.items[hash_key]


def transact_write_items(backend: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
    named = _named_items(backend, transact_items)
    if named is None:
        return _moto_transact_write_items(backend, transact_items)
    _items_only.active = True
    try:
        return _moto_transact_write_items(backend, transact_items)
    except Exception:
        _restore(named)
        raise
    finally:
        _items_only.active = False


def item_copies_in_transactions() -> list[Any]:
    """The patches (start/stop, or context managers), for as long as a twin runs."""
    return [mock.patch.object(dynamodb_models, "copy", _COPY),
            mock.patch.object(DynamoDBBackend, "transact_write_items", transact_write_items)]
