#!/bin/sh
# Installs switchyard as a systemd service: the binary, the unit and (once) the config.
set -eu

usage() {
    cat <<'EOF'
Usage: packaging/install.sh [--binary PATH] [--destdir DIR] [--no-systemctl]

  --binary PATH    install this binary instead of building one
                   (default: cargo build --release --locked, then target/release/switchyard)
  --destdir DIR    install under DIR instead of / (for packaging; implies --no-systemctl)
  --no-systemctl   do not run `systemctl daemon-reload`
  -h, --help       show this help

Installs /usr/local/bin/switchyard, /etc/systemd/system/switchyard.{service,socket} and, unless one
exists already, /etc/switchyard/switchyard.toml. Run as root, e.g. build as yourself first:
  cargo build --release --locked
  sudo packaging/install.sh --binary target/release/switchyard
EOF
}

die() {
    echo "install.sh: $*" >&2
    exit 1
}

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
binary=
destdir=${DESTDIR:-}
systemctl=yes

while [ $# -gt 0 ]; do
    case $1 in
        --binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
        --destdir) [ $# -ge 2 ] || die "--destdir needs a directory"; destdir=$2; shift 2 ;;
        --no-systemctl) systemctl=no; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

if [ -n "$destdir" ]; then
    systemctl=no
elif [ "$(id -u)" -ne 0 ]; then
    die "run as root (sudo), or pass --destdir DIR"
fi

if [ -z "$binary" ]; then
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found; build first and pass --binary target/release/switchyard"
    echo "building: cargo build --release --locked"
    (cd "$root" && cargo build --release --locked)
    binary=$root/target/release/switchyard
fi
[ -f "$binary" ] && [ -x "$binary" ] || die "no executable binary at $binary"

bin_dir=$destdir/usr/local/bin
unit_dir=$destdir/etc/systemd/system
conf_dir=$destdir/etc/switchyard
conf=$conf_dir/switchyard.toml

install -d -m 0755 "$bin_dir" "$unit_dir"
install -d -m 0750 "$conf_dir"
install -m 0755 "$binary" "$bin_dir/switchyard"
echo "installed $bin_dir/switchyard"
# The unit names the packaged binary (/usr/bin); this script installs to /usr/local/bin.
sed 's#/usr/bin/switchyard#/usr/local/bin/switchyard#g' "$here/systemd/switchyard.service" \
    > "$unit_dir/switchyard.service"
chmod 0644 "$unit_dir/switchyard.service"
echo "installed $unit_dir/switchyard.service"
install -m 0644 "$here/systemd/switchyard.socket" "$unit_dir/switchyard.socket"
echo "installed $unit_dir/switchyard.socket (enable it to keep the listener open across restarts)"
if [ -e "$conf" ]; then
    echo "kept existing $conf (the example is $here/switchyard.toml)"
else
    install -m 0640 "$here/switchyard.toml" "$conf"
    echo "installed $conf"
fi

if [ -n "$destdir" ]; then
    exit 0
fi

# Catch a config the new binary no longer accepts before the service is restarted.
"$bin_dir/switchyard" --config "$conf" config check >/dev/null ||
    die "$conf does not pass \`switchyard config check\`; fix it before (re)starting"

if [ "$systemctl" = yes ]; then
    systemctl daemon-reload
    reload_step=
else
    reload_step="  sudo systemctl daemon-reload
"
fi
cat <<EOF

Next steps (after an upgrade: sudo systemctl restart switchyard):
${reload_step}  sudo systemctl enable --now switchyard
  sudo switchyard --config $conf account import ~/.codex/auth.json
  sudo switchyard --config $conf key create NAME    # prints the client key once
See docs/operations.md.
EOF
