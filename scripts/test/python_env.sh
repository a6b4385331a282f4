#!/usr/bin/env bash
# Creates (once) the Python environment the end-to-end tests drive Tandem with, in a virtual
# environment under Tandem's cache directory: the official `openai` SDK, the clients
# applications build on it (LangChain's `langchain-openai`, LiteLLM) and `jsonschema` to check
# structured outputs, all pinned, from PyPI.
# Prints the environment's python path on stdout.
set -euo pipefail
# LiteLLM fetches a price list from GitHub on import unless told to use its own copy.
export LITELLM_LOCAL_MODEL_COST_MAP=True
PACKAGES=("openai==3.54.0" "langchain-openai==1.7.4" "litellm==1.110.2" "jsonschema==4.26.0")
cache="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}"
tag=$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-12)
env_dir="$cache/pyenv-clients-$tag"
py="$env_dir/bin/python"
check="import openai, langchain_openai, litellm, jsonschema"
# The imports take seconds of CPU (LiteLLM's alone ~5 s): checked once, then remembered.
ready="$env_dir/.imports-ok"
if [ -x "$py" ] && [ -e "$ready" ]; then
  echo "$py"
  exit 0
fi
if [ -x "$py" ] && "$py" -c "$check" >/dev/null 2>&1; then
  touch "$ready"
  echo "$py"
  exit 0
fi
mkdir -p "$cache"
# Tests run in parallel: one creates the environment while the others wait for it.
exec 9>"$env_dir.lock"
flock 9
if [ -x "$py" ] && "$py" -c "$check" >/dev/null 2>&1; then
  touch "$ready"
  echo "$py"
  exit 0
fi
rm -rf "$env_dir.tmp"
python3 -m venv "$env_dir.tmp" >&2
"$env_dir.tmp/bin/pip" install --disable-pip-version-check --quiet "${PACKAGES[@]}" >&2
rm -rf "$env_dir"
mv "$env_dir.tmp" "$env_dir"
# The venv's scripts hold its path; recreate the interpreter link in place after the move.
python3 -m venv "$env_dir" >&2
"$py" -c "$check; print('openai', openai.__version__)" >&2
touch "$ready"
echo "$py"
