#!/usr/bin/env python3
"""A webhook receiver for Herald's tests.

Every delivery is verified with the `standardwebhooks` reference package
from PyPI, not with Herald's code, under each secret listed (one per line)
in SECRETS_FILE, read afresh for every request. Each request is logged as a
JSON line. The first FAIL_FIRST requests are answered 500, the rest 204.

Usage: receiver.py PORT SECRETS_FILE LOG_FILE FAIL_FIRST
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

PORT, SECRETS, LOG, FAIL_FIRST = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
lock = threading.Lock()
seen = [0]


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        with open(SECRETS) as f:
            secrets = [line.strip() for line in f if line.strip()]
        verified = {}
        for secret in secrets:
            try:
                Webhook(secret).verify(body, headers)
                verified[secret] = True
            except WebhookVerificationError:
                verified[secret] = False
        with lock:
            seen[0] += 1
            fail = seen[0] <= FAIL_FIRST
            record = {
                "n": seen[0],
                "id": headers.get("webhook-id"),
                "verified": verified,
                "answered": 500 if fail else 204,
                "body": json.loads(body),
            }
            with open(LOG, "a") as f:
                f.write(json.dumps(record) + "\n")
        self.send_response(500 if fail else 204)
        self.end_headers()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
