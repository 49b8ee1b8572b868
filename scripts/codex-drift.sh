#!/usr/bin/env bash
# What a Codex CLI release sends that the pinned one did not: runs the wire-list test
# (tests/it/real_clients.rs, `codex_cli_reaches_the_backend_with_the_committed_wire_names…`)
# with another release of @openai/codex — the newest by default — and prints the names the
# backend saw that tests/fixtures/codex-wire-0.171.json does not list, and those it lists
# that did not come.
#
#   scripts/codex-drift.sh            # @openai/codex@latest
#   scripts/codex-drift.sh 0.172.0    # a given release
#
# To move the pin: check each new name (does the header policy let it through as it should?
# is it an identity field?), then copy the printed list over a new fixture for that version,
# and change CODEX_VERSION in .ci/run and the fixture the test reads.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:-latest}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

npm install --prefix "$work/node" --no-audit --no-fund --loglevel=error "@openai/codex@$version" >/dev/null
codex="$work/node/node_modules/.bin/codex"
echo "Codex CLI: $("$codex" --version)" >&2

seen="$work/seen.json"
SWITCHYARD_TEST_CODEX="$codex" SWITCHYARD_WIRE_OUT="$seen" SWITCHYARD_WIRE_ALLOW_NEW=1 \
  cargo test -q --test it -- --exact \
  real_clients::codex_cli_reaches_the_backend_with_the_committed_wire_names_and_no_device_id \
  >"$work/test.log" 2>&1 || { cat "$work/test.log" >&2; echo "the test run failed" >&2; exit 1; }

python3 - "$seen" tests/fixtures/codex-wire-0.171.json <<'PY'
import json, sys
seen = json.load(open(sys.argv[1]))
known = json.load(open(sys.argv[2]))
changed = False
for part in ("headers", "body", "client_metadata", "turn_metadata"):
    new = sorted(set(seen[part]) - set(known[part]))
    gone = sorted(set(known[part]) - set(seen[part]))
    for n in new:
        print(f"+ {part}: {n}")
    for n in gone:
        print(f"- {part}: {n}")
    changed |= bool(new or gone)
if not changed:
    print("no difference from the pinned release's wire names")
print("\nthe names this release sent:\n" + json.dumps(seen, indent=2), file=sys.stderr)
PY
