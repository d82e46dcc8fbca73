# The example app of the leader-sidecar chart: serves its pod name and its sidecar's answer
# on :8080, so `curl http://<release>-leader-sidecar-leader/` shows which pod leads (always
# the same one, whichever replica you hit through the leader Service). A real app asks
# GET http://127.0.0.1:4040/leader before acting and attaches the term to every write.
import http.server
import json
import os
import urllib.error
import urllib.request

SIDECAR = os.environ.get("SIDECAR_URL", "http://127.0.0.1:4040/leader")
POD = os.environ.get("POD_NAME", "unknown")


def ask_sidecar():
    try:
        with urllib.request.urlopen(SIDECAR, timeout=2) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:  # 503: a follower; the body is the same JSON
        return json.load(error)
    except OSError as error:
        return {"leader": False, "error": str(error)}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        state = ask_sidecar()
        body = json.dumps({"pod": POD, "leader": state.get("leader"), "sidecar": state}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("", 8080), Handler).serve_forever()
