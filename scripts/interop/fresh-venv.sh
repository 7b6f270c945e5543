# Sourced by the install scripts: fresh_venv DIR makes an empty Python venv at DIR (removing what
# was there), installing Debian's python3-venv first when `python3 -m venv` lacks it.
fresh_venv() {
  local venv=$1
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    local sudo=()
    [[ $(id -u) == 0 ]] || sudo=(sudo)
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    rm -rf "$venv"
    python3 -m venv "$venv"
  fi
}
