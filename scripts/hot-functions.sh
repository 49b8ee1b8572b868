#!/usr/bin/env bash
# Writes link/hot-functions.txt: the release binary's functions that run for every answer,
# hottest first. build.rs hands the list to the linker, which lays those functions out side
# by side at the start of the code (docs/architecture.md, Performance).
#
# It runs the load program's long run (`LOAD_ONLY=rss`) twice under callgrind, for 10,000
# and 30,000 answers, and keeps each instruction run at least once per answer in the
# difference. Needs valgrind, nginx (as the load program does) and python3.
#
# The names carry the compiler's hashes, so rerun it after a change of toolchain or of a
# dependency, or when a hot function is renamed or added: names the binary no longer has
# are skipped by the linker, and what they named is then laid out as if unlisted.
#
#   scripts/hot-functions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind python3 nm; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

cargo build --release --bin switchyard
load=$(cargo bench --bench load --no-run 2>&1 |
  sed -n 's/.*(\(target\/release\/deps\/load-[0-9a-f]*\)).*/\1/p' | tail -1)
[ -x "$load" ] || { echo "the load program was not built" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp target/release/switchyard "$work/switchyard"
# The load program starts the gateway with `LOAD_GATEWAY ARGS…`; the served one runs under
# callgrind, its other commands (key and account set-up) as they are.
cat > "$work/gateway" <<EOF
#!/usr/bin/env bash
for a in "\$@"; do
  if [ "\$a" = serve ]; then
    exec valgrind --tool=callgrind --dump-instr=yes \
      --callgrind-out-file=$work/out.\$CG_RUN.%p $work/switchyard "\$@"
  fi
done
exec $work/switchyard "\$@"
EOF
chmod +x "$work/gateway"
for n in 10000 30000; do
  echo "$n answers under callgrind…" >&2
  CG_RUN=$n LOAD_GATEWAY="$work/gateway" LOAD_ONLY=rss LOAD_RSS_REQUESTS=$n \
    "$load" --bench >"$work/log.$n" 2>&1 || { cat "$work/log.$n" >&2; exit 1; }
done
nm -n -S --defined-only "$work/switchyard" >"$work/symbols"

python3 - "$work" <<'EOF'
import bisect, collections, glob, os, re, sys

work = sys.argv[1]

def costs(path):
    """Instructions run per address of the gateway's binary (calls' inclusive lines left out)."""
    names, ob, ours = {}, None, False
    runs = collections.Counter()
    at, call = 0, False
    for line in open(path):
        c = line[:1]
        if c.isdigit() or c in "+-*":
            field = line.split()
            a = field[0]
            if a.startswith("0x"):
                at = int(a, 16)
            elif a[0] == "+":
                at += int(a[1:])
            elif a[0] == "-":
                at -= int(a[1:])
            if call:
                call = False
            elif ours and len(field) > 2:
                runs[at] += int(field[2])
            continue
        m = re.match(r"(c?ob)=\((\d+)\)(?: (.*))?", line.strip())
        if m:
            if m.group(3):
                names[m.group(2)] = m.group(3)
            if m.group(1) == "ob":
                ob = names.get(m.group(2), "")
                ours = ob.endswith("/switchyard")
        elif line.startswith("calls="):
            call = True
    return runs

def biggest(run):
    return max(glob.glob(f"{work}/out.{run}.*"), key=os.path.getsize)

short, long_ = costs(biggest(10000)), costs(biggest(30000))
answers = 20000
syms = []
for line in open(f"{work}/symbols"):
    f = line.split()
    if len(f) == 4 and f[2] in "tTwW":
        syms.append((int(f[0], 16), int(f[1], 16), f[3]))
starts = [s[0] for s in syms]
heat = collections.Counter()
for at, n in long_.items():
    per = (n - short.get(at, 0)) / answers
    if per < 0.5:
        continue
    i = bisect.bisect_right(starts, at) - 1
    if i >= 0 and at < syms[i][0] + syms[i][1]:
        heat[syms[i][2]] += per


def pattern(name):
    """A symbol's name as build.rs takes it: without the legacy hash, any crate's hash a `*`."""
    m = re.fullmatch(r"(_ZN.*)17h[0-9a-f]{16}E(\.\d+)?", name)
    if m:
        return m.group(1)
    return re.sub(r"Cs[0-9A-Za-z]+_", "Cs*_", name) if name.startswith("_R") else name


# A name without its hash stands for every instance of a generic function; one whose other
# instances (those that did not run) are large would spread the hot ones apart, and is left out.
spare = collections.Counter()
for start, size, name in syms:
    if name not in heat:
        spare[pattern(name)] += size
names, left = [], []
for name, _ in heat.most_common():
    p = pattern(name)
    if p in names or p in left:
        continue
    (names if spare[p] <= 40 * 1024 else left).append(p)
with open("link/hot-functions.txt", "w") as out:
    out.write("".join(n + "\n" for n in names))
size = sum(s[1] for s in syms if pattern(s[2]) in names)
print(f"{len(names)} names ({size // 1024} KiB of code) written to link/hot-functions.txt")
print(f"left out for their other instances: {', '.join(left) or 'none'}")
EOF
