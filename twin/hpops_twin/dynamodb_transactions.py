"""TransactWriteItems in moto at the cost of the items it writes, not of the whole table.

moto 5.2.1 backs up every table a transaction names with ``copy.deepcopy(table)`` before it writes,
so that a cancelled transaction can put the backup in the table's place
(moto/dynamodb/models/__init__.py, ``transact_write_items``). Every write then costs as much as the
table holds: RecordUsageReport's month of usage windows (one transaction per window, all in the
SyncStateTable) grows quadratically, and most of a month's CPU went into those copies.

Here the backup is the same table with only the transaction's own items deep-copied: the other items
are shared with the live table, which a transaction does not change (moto's put and delete replace or
remove an item of the table's dicts, only update changes one in place, and each of those is one the
transaction names). A cancelled transaction still leaves every item as it was; anything the key
cannot be read from (a missing table, a malformed key) gets moto's whole copy, as before.
"""

from __future__ import annotations

import copy
import threading
from collections import defaultdict
from typing import Any
from unittest import mock

from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table

_TRANSACTION = threading.local()  # the keys of the transaction this thread is in, by table name


def _keys_written(backend: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> dict[str, set] | None:
    """(hash, range) of every item the transaction names, by table; None if one cannot be read."""
    keys: dict[str, set] = {}
    try:
        for entry in transact_items:
            for op in entry.values():
                table = backend.tables[op["TableName"]]
                key = op["Item"] if "Item" in op else op["Key"]
                range_value = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
                keys.setdefault(table.name, set()).add((DynamoType(key[table.hash_key_attr]), range_value))
    except Exception:  # moto refuses it itself; the backup is then moto's own
        return None
    return keys


def _table_backup(table: Table, memo: dict) -> Table:
    """Table's deep copy: in a transaction, with only the transaction's items copied."""
    clone = Table.__new__(type(table))
    memo[id(table)] = clone
    keys = getattr(_TRANSACTION, "keys", None)
    state = vars(table)
    if keys is None:  # not in a transaction (a backup, say): a whole copy, as deepcopy makes it
        clone.__dict__.update(copy.deepcopy(state, memo))
        return clone
    clone.__dict__.update(copy.deepcopy({name: value for name, value in state.items() if name != "items"}, memo))
    ranged = table.range_key_attr is not None
    items: defaultdict = defaultdict(dict)
    for hash_value, held in table.items.items():
        items[hash_value] = dict(held) if ranged else held
    for hash_value, range_value in keys.get(table.name, ()):
        if ranged and range_value in items.get(hash_value, {}):
            items[hash_value][range_value] = copy.deepcopy(items[hash_value][range_value], memo)
        elif not ranged and hash_value in items:
            items[hash_value] = copy.deepcopy(items[hash_value], memo)
    clone.items = items
    return clone


def transactions_copy_only_their_items() -> tuple[Any, Any]:
    """The two patches (started and stopped by the world, as its other fixes)."""
    original = DynamoDBBackend.transact_write_items

    def transact_write_items(backend: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
        _TRANSACTION.keys = _keys_written(backend, transact_items)
        try:
            return original(backend, transact_items)
        finally:
            _TRANSACTION.keys = None

    return (mock.patch.object(Table, "__deepcopy__", _table_backup, create=True),
            mock.patch.object(DynamoDBBackend, "transact_write_items", transact_write_items))
