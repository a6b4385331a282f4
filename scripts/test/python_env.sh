#!/usr/bin/env bash
# Creates (once) the Python environment the end-to-end tests drive Tandem with: the official
# `openai` SDK from PyPI, in a virtual environment under Tandem's cache directory.
# Prints the environment's python path on stdout.
set -euo pipefail
OPENAI_VERSION="3.54.0"
cache="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}"
env_dir="$cache/pyenv-openai-$OPENAI_VERSION"
py="$env_dir/bin/python"
if [ -x "$py" ] && "$py" -c "import openai; assert openai.__version__ == '$OPENAI_VERSION'" >/dev/null 2>&1; then
  echo "$py"
  exit 0
fi
mkdir -p "$cache"
rm -rf "$env_dir.tmp"
python3 -m venv "$env_dir.tmp" >&2
"$env_dir.tmp/bin/pip" install --disable-pip-version-check --quiet "openai==$OPENAI_VERSION" >&2
rm -rf "$env_dir"
mv "$env_dir.tmp" "$env_dir"
# The venv's scripts hold its path; recreate the interpreter link in place after the move.
python3 -m venv "$env_dir" >&2
"$py" -c "import openai; print('openai', openai.__version__)" >&2
echo "$py"
