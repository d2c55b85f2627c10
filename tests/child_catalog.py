"""A test's catalog entries and its loopback allowance, also in the child processes Blender's
operators start (runtime/child_process.py runs `python -m lean_image_ai models install ...`).

The child inherits the host's sys.path, so a ``sitecustomize`` in a folder the test prepends to
it runs first thing in the child: it adds the entries the test wrote (a JSON file named by an
environment variable only tests set), allows http to 127.0.0.1 as the tests' model server needs,
and makes the download's chunks small so a cancel lands mid-transfer. Nothing of this is in the
product.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

ENV = "LEAN_IMAGE_AI_TEST_CHILD_CATALOG"

SITE = '''
import contextlib, importlib.util, json, os, sys
_path = os.environ.get("LEAN_IMAGE_AI_TEST_CHILD_CATALOG")
_WATCH = "lean_image_ai.models.store.transfer.http_watch"


class _AllowLoopback:
    """http to 127.0.0.1 once the download's watch loads (only where a download runs: importing it
    here would load it into Blender's process, which never downloads)."""

    def find_spec(self, name, path=None, target=None):
        if name != _WATCH:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.PLAIN_HTTP_HOSTS = module.LOOPBACK_HOSTS  # the whole child process: the test's server

        spec.loader.exec_module = exec_module
        return spec


if _path:
    from lean_image_ai.models.store import library
    from lean_image_ai.models.store.catalog import CatalogEntry
    _real_catalog, _real_fetch = library.catalog, library.fetch

    def _spec():
        with open(_path, encoding="utf-8") as fh:
            return json.load(fh)

    def catalog(folder):
        known = _real_catalog(folder)
        for fields in _spec()["entries"]:
            known._builtin[fields["id"]] = CatalogEntry(**fields)
        return known

    def fetch(*args, **kwargs):
        kwargs["chunk_size"] = kwargs.get("chunk_size") or _spec()["chunk_size"]
        return _real_fetch(*args, **kwargs)

    library.catalog, library.fetch = catalog, fetch
    if _WATCH in sys.modules:
        sys.modules[_WATCH].PLAIN_HTTP_HOSTS = sys.modules[_WATCH].LOOPBACK_HOSTS
    else:
        sys.meta_path.insert(0, _AllowLoopback())
'''


def _plain(value):
    return dict(value) if hasattr(value, "keys") else value


class ChildCatalog:
    def __init__(self, folder: Path, monkeypatch, chunk_size: int):
        self.folder, self.chunk_size = Path(folder), chunk_size
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "sitecustomize.py").write_text(SITE, encoding="utf-8")
        self.spec = self.folder / "child_catalog.json"
        self.write([])
        monkeypatch.setenv(ENV, str(self.spec))
        monkeypatch.syspath_prepend(str(self.folder))

    def write(self, entries) -> None:
        fields = [{f.name: _plain(getattr(e, f.name)) for f in dataclasses.fields(e)} for e in entries]
        self.spec.write_text(json.dumps({"entries": fields, "chunk_size": self.chunk_size}, default=str), encoding="utf-8")
