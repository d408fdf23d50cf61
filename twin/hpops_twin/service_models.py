"""One loader of botocore's service models for the whole twin process.

Each botocore session parses the service models it uses (JSON files of up to megabytes) into a loader
of its own. A twin makes many sessions (the harness's, the handlers' default one, each node agent's,
each simulated user's), and a test run makes hundreds of twins. The models are read-only data, so
the sessions made while a twin runs share this loader: each model is parsed once per process.
"""

from __future__ import annotations

from unittest import mock

import botocore.loaders
import botocore.session

LOADER = botocore.loaders.create_loader()


def _register_shared_loader(session: botocore.session.Session) -> None:
    session._components.lazy_register_component("data_loader", lambda: LOADER)


def sessions_share_models() -> mock._patch:
    """A patch (start/stop, or a context manager): every botocore session made while it is active
    loads its service models through LOADER."""
    return mock.patch.object(botocore.session.Session, "_register_data_loader", _register_shared_loader)
