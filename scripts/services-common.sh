# What every service script needs, sourced by scripts/services.sh and by each
# scripts/services.d/*.sh after it has set `log_tag` (`services`, `services/kafka`...).
# Not a service itself: it lives outside services.d so that services.sh does not run it.

# One line on stderr, tagged: `[services/kafka] ...`.
log() { printf '[%s] %s\n' "$log_tag" "$*" >&2; }

# Install Debian packages, quietly; `apt-get update` once per script.
apt_install() {
  if [ -z "${APT_UPDATED:-}" ]; then
    apt-get update -qq >/dev/null
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Whether something accepts TCP connections on host $1, port $2.
listening() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# When something listens on host $1, port $2: log $3 and end the script, successfully (the
# service already runs).
exit_if_listening() {
  if listening "$1" "$2"; then
    log "$3"
    exit 0
  fi
}
