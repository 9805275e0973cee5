#!/usr/bin/env bash
# The GPU device check (bench/gpu_device_check.py) on a lent GPU machine, whose python3 has torch,
# nvidia-ml-py, psutil and prometheus-client but not the rest of the sidecar's dependencies.
#
#   bash bench/gpu_device_check.sh wheels   # here, once: those wheels into .whl/ (git-ignored)
#   bash bench/gpu_device_check.sh          # there (the device tool's run, carrying .whl): the check
#
# SOAK_CHECK_BACKEND=mock runs the same check on the mock NVML (what CI runs, without the wheels step).
set -euo pipefail
cd "$(dirname "$0")/.."

# The sidecar's pins (requirements.lock) the device's Python lacks: pydantic-settings and boto3 with
# what they need. The kubernetes client is not needed: `run --local` never loads it.
WHEELS=(
  pydantic==2.13.4 pydantic-core==2.46.4 pydantic-settings==2.14.1 python-dotenv==1.2.2
  typing-extensions==4.15.0 annotated-types==0.7.0 typing-inspection==0.4.2
  boto3==1.43.11 botocore==1.43.11 s3transfer==0.17.0 jmespath==1.1.0 python-dateutil==2.9.0.post0
  six==1.17.0 urllib3==2.7.0
)

if [ "${1:-}" = wheels ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  platforms=()
  for n in 28 27 17 5; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
  ls .whl
  exit 0
fi

backend="${SOAK_CHECK_BACKEND:-nvml}"
if [ "$backend" = nvml ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
  nvidia-smi -L || echo "nvidia-smi: not found or failed"
  echo "kernel $(uname -r)"
fi
exec timeout 280 python3 bench/gpu_device_check.py --backend "$backend" --python "${SOAK_CHECK_PYTHON:-python3}"
