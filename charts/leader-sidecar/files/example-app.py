# The example app of the leader-sidecar chart: serves its pod name and its sidecar's answer
# on :8080, so `curl http://<release>-leader-sidecar-leader/` shows which pod leads (always
# the same one, whichever replica you hit through the leader Service). A real app asks
# GET http://127.0.0.1:4040/leader before acting and attaches the term to every write.
#
# With several leases (lease.names, lease.shards) SIDECAR_URL ends in /leases: the app
# long-polls it and, on every change and every few seconds, works on each shard its sidecar
# holds, fencing that shard's writes with that shard's term (printed as one JSON line each).
#
# GET /healthz answers 200 while the app serves, without asking the sidecar: the endpoint for
# app.health.path=/healthz, app.health.port=8080 (the sidecar then leads only beside a live
# app). SIGTERM stops the app at once (as PID 1 it would otherwise ignore it until the grace
# period's SIGKILL), so a draining leader sees its app stop and hands over.
import http.server
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

SIDECAR = os.environ.get("SIDECAR_URL", "http://127.0.0.1:4040/leader")
POD = os.environ.get("POD_NAME", "unknown")
PORT = int(os.environ.get("PORT", "8080"))
SHARDED = SIDECAR.endswith("/leases")
WAIT = 5  # seconds a long-poll is held: the work interval when nothing changes


def ask_sidecar(url=SIDECAR, headers=None, timeout=2):
    try:
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response), response.headers.get("ETag", "")
    except urllib.error.HTTPError as error:  # 503: a follower; the body is the same JSON
        return json.load(error), ""
    except (OSError, ValueError) as error:
        return {"leader": False, "error": str(error)}, ""


def work_on_held_shards():
    etag, rounds = "", 0
    while True:
        # Returns at once when the state differs from `etag`, else after WAIT seconds.
        state, etag = ask_sidecar(
            f"{SIDECAR}?wait={WAIT}", {"If-None-Match": etag} if etag else {}, WAIT + 2
        )
        rounds += 1
        for lease in state.get("leases", []):
            if not lease.get("leader"):
                continue
            shard = lease["lease"].rpartition("/")[2]  # namespace/name on Kubernetes
            # The shard's work; its writes carry the term, and the store refuses a term older
            # than the newest it has seen, so a deposed holder's late write cannot land.
            item = f"{shard}/item-{rounds}"
            line = {"pod": POD, "shard": shard, "term": lease["term"], "wrote": item}
            print(json.dumps(line), flush=True)
        if "error" in state:
            time.sleep(1)  # the sidecar is not up yet: do not spin


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/healthz":
            self.answer(json.dumps({"pod": POD, "up": True}).encode())
            return
        state, _ = ask_sidecar()
        if SHARDED:
            held = [s["lease"] for s in state.get("leases", []) if s.get("leader")]
            body = json.dumps({"pod": POD, "held": held, "sidecar": state}).encode()
        else:
            body = json.dumps({"pod": POD, "leader": state.get("leader"), "sidecar": state})
            body = body.encode()
        self.answer(body)

    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
if SHARDED:
    threading.Thread(target=work_on_held_shards, daemon=True).start()
http.server.ThreadingHTTPServer(("", PORT), Handler).serve_forever()
