"""Where a pod's service account is mounted: the credentials the Kubernetes store reads, and
the namespace the sidecar defaults to in a cluster."""

from __future__ import annotations

from pathlib import Path

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
