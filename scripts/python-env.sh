# Sourced by the other scripts: sets PYTHON, the interpreter everything is installed into and
# run with. By default that is a virtual environment of the project's own, .venv/ at the top
# of the checkout, made on first use from `python3`: the user's Python and the packages it
# already has (a torch of their own, say) are left as they are. PYTHON=/path/to/python picks
# another interpreter, which is then installed into as it is.
if [ -z "${PYTHON:-}" ]; then
  streamnccl_venv="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv"
  if [ ! -x "$streamnccl_venv/bin/python" ]; then
    echo "streamnccl: making the virtual environment $streamnccl_venv" >&2
    python3 -m venv "$streamnccl_venv"
  fi
  PYTHON="$streamnccl_venv/bin/python"
fi
export PYTHON
