"""A NodeChannel stand-in for real-process agent tests: Lambda's Invoke API on loopback
(AWS_ENDPOINT_URL_LAMBDA), answering "enroll" (any key, first presenter wins, as the function does for
a node inside its window) and "fetch", with the signature checked by the stack's own node_proof against
the enrolled key and each item read (by the test's ``read``) from the moto server the test runs. The real
function: tests/node/test_enrollment_real_process.py and the twin."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hpops_core.node_channel import node_proof

FUNCTION = "hpops-NodeChannelFunction"


class ChannelStandIn:
    def __init__(self, port: int, cluster: str, read) -> None:
        self.cluster, self.read = cluster, read  # read(item, instance id) -> {"value", "version"} | None
        self.enrolled: dict[str, str] = {}  # instance id -> public key line
        self.requests: list[str] = []
        self.http = ThreadingHTTPServer(("127.0.0.1", port), self._api())
        self.endpoint = f"http://127.0.0.1:{port}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def answer(self, request: dict) -> dict:
        self.requests.append(request.get("action"))
        if request.get("action") == "enroll":
            statement = request["statement"]
            key = self.enrolled.setdefault(statement["instanceId"], statement["agentPublicKey"])
            node_proof.verify_body({"statement": statement, "proof": request["proof"]}, key, "enroll", self.cluster)
            return {"ok": True, "status": "enrolled", "fingerprint": node_proof.fingerprint(key), "role": "login"}
        body = dict(request["request"], proof=request["proof"])
        node_proof.verify_body(body, self.enrolled[body["instanceId"]], "fetch", self.cluster)
        items = {item: self.read(item, body["instanceId"]) for item in body["what"]}
        return {"ok": True, "instanceId": body["instanceId"], "items": items}

    def _api(self):
        stand_in = self

        class LambdaApi(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    answer = stand_in.answer(request)
                except Exception as error:  # a refusal, as the function answers one
                    answer = {"ok": False, "error": type(error).__name__, "message": str(error)}
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        return LambdaApi

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
