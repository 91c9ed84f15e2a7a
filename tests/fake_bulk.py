"""A fake ``_bulk`` HTTP target with fault injection (OpenSearch bulk-writer tests and the index job's);
conftests re-export the ``fake_bulk`` fixture: ``from fake_bulk import fake_bulk``."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

__all__ = ["FakeBulkTarget", "fake_bulk"]


class FakeBulkTarget:
    """A minimal HTTP ``_bulk`` endpoint (what ``streaming_bulk`` talks to), storing docs by ``_id``.

    Faults: ids in ``fail_ids`` get a permanent 400 ``mapper_parsing_exception``; ids in
    ``flaky_ids`` get one 429 (then succeed), ``unavailable_ids`` one item-level 503; the statuses in
    ``request_failures`` fail whole ``_bulk`` requests, one each; ``delay`` seconds per request slow
    the job down so a test can kill it mid-run. ``max_in_flight``: the most ``_bulk`` requests served at once.
    """

    def __init__(self, fail_ids=(), flaky_ids=(), delay: float = 0.0, unavailable_ids=(),
                 request_failures=()) -> None:
        self.docs: dict[str, dict] = {}
        self.writes: dict[str, int] = {}
        self.fail_ids = set(fail_ids)
        self.flaky_ids = set(flaky_ids)
        self.unavailable_ids = set(unavailable_ids)  # one item-level 503 each, then success
        self.request_failures = list(request_failures)  # statuses for the next whole _bulk requests
        self.delay = delay
        self.mappings = {"text": {"type": "text"}, "sparse_embedding": {"type": "rank_features"}}
        self.requests = 0
        self.in_flight = 0  # _bulk requests being served now, and the most at once
        self.max_in_flight = 0
        self.lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.split("?")[0].endswith("/_count"):
                    return self._send(200, {"count": len(target.docs)})
                if self.path.split("?")[0].endswith("/_mapping"):  # OpenSearchBulkWriter.check_target
                    index = self.path.split("?")[0].strip("/").split("/")[0]
                    return self._send(200, {index: {"mappings": {"properties": target.mappings}}})
                return self._send(200, {"version": {"number": "3.3.0", "distribution": "opensearch"}})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                path = self.path.split("?")[0]
                if path.endswith("/_refresh"):
                    return self._send(200, {"_shards": {"total": 1, "successful": 1, "failed": 0}})
                if not path.endswith("/_bulk"):
                    return self._send(404, {"error": "not found"})
                with target.lock:
                    target.in_flight += 1
                    target.max_in_flight = max(target.max_in_flight, target.in_flight)
                try:
                    return self._bulk(body)
                finally:
                    with target.lock:
                        target.in_flight -= 1

            def _bulk(self, body):
                time.sleep(target.delay)
                with target.lock:
                    target.requests += 1
                    status = target.request_failures.pop(0) if target.request_failures else None
                if status is not None:
                    return self._send(status, {"error": {"type": "injected", "reason": f"injected {status}"},
                                               "status": status})
                lines = [l for l in body.decode("utf-8").split("\n") if l]
                items = []
                with target.lock:
                    for meta_line, src_line in zip(lines[::2], lines[1::2]):
                        meta = json.loads(meta_line)["index"]
                        did = meta["_id"]
                        if did in target.fail_ids:
                            items.append({"index": {"_id": did, "status": 400, "error": {
                                "type": "mapper_parsing_exception", "reason": f"injected failure for {did}"}}})
                        elif did in target.unavailable_ids:
                            target.unavailable_ids.discard(did)
                            items.append({"index": {"_id": did, "status": 503, "error": {
                                "type": "unavailable_shards_exception", "reason": "primary shard is not active"}}})
                        elif did in target.flaky_ids:
                            target.flaky_ids.discard(did)
                            items.append({"index": {"_id": did, "status": 429, "error": {
                                "type": "es_rejected_execution_exception", "reason": "queue full"}}})
                        else:
                            target.docs[did] = json.loads(src_line)
                            target.writes[did] = target.writes.get(did, 0) + 1
                            items.append({"index": {"_id": did, "status": 201, "result": "created"}})
                errors = any("error" in it["index"] for it in items)
                return self._send(200, {"took": 1, "errors": errors, "items": items})

            do_PUT = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_bulk():
    targets = []

    def make(**kw):
        t = FakeBulkTarget(**kw)
        targets.append(t)
        return t

    yield make
    for t in targets:
        t.close()
