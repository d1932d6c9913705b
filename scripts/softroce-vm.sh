#!/usr/bin/env bash
# Runs commands on a real RDMA device without RDMA hardware: boots a stock
# Debian kernel in qemu (software emulation, no network to the outside),
# creates a Soft-RoCE device rxe0 on a dummy interface, runs the given
# commands in the guest with this project's verbs binaries and test
# executables, and brings their logs and records back.
#
#   scripts/softroce-vm.sh [options] COMMAND...
#   scripts/softroce-vm.sh [options] -f FILE      (one command per line)
#
# Each COMMAND is one shell command line for the guest's busybox sh. In it:
#   - PATH holds memory-blade, compute-blade, and each test executable as
#     PACKAGE-TARGET (e.g. smart-core-it), built with the feature verbs;
#   - $OUT is the results directory (shared with the host: write records there);
#   - SMART_RDMA_DEVICE=rxe0 (the device tests read it);
#   - `with-blade [memory-blade args] -- CMD...` starts a verbs memory-blade on
#     127.0.0.1, runs CMD with every argument `{blade}` replaced by its
#     address, then stops the blade (SIGTERM) and fails if it did not exit 0.
#
# Options:
#   -f FILE        read commands from FILE (blank lines and # comments skipped)
#   --out DIR      where logs and records land (default target/softroce/out);
#                  command N's output is DIR/N.log, its exit status DIR/N.rc
#   --timeout S    host-side bound on the VM's whole life (default 900)
#   --cmd-timeout S  bound on each command (default 300): past it, the
#                  command's process group gets SIGTERM, 10 s later SIGKILL,
#                  its status is 124, and the next command runs
#   --no-build     use the binaries of the last build
#   --smp N --mem SIZE   guest CPUs and memory (default 2 and 4G)
#
# Exits 0 when every command exited 0, 1 when one failed or the VM ended
# early, 2 on bad usage. Needs root (or sudo) only to install missing
# Debian packages; qemu itself runs unprivileged and without /dev/kvm.
# Under emulation everything is ~100x slower: the VM proves behaviour,
# never performance.
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$(pwd)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
die() { echo "softroce-vm: $*" >&2; exit 1; }
say() { echo "softroce-vm: $*"; }

cmds=()
out=target/softroce/out
vm_timeout=900
cmd_timeout=300
build=1
smp=2
mem=4G
while [ $# -gt 0 ]; do
  case $1 in
    -f) [ $# -ge 2 ] || usage
        [ -r "$2" ] || die "cannot read command file $2"
        while IFS= read -r line || [ -n "$line" ]; do
          case $line in ''|'#'*) continue ;; esac
          cmds+=("$line")
        done <"$2"
        shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --timeout) [ $# -ge 2 ] || usage; vm_timeout=$2; shift 2 ;;
    --cmd-timeout) [ $# -ge 2 ] || usage; cmd_timeout=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --smp) [ $# -ge 2 ] || usage; smp=$2; shift 2 ;;
    --mem) [ $# -ge 2 ] || usage; mem=$2; shift 2 ;;
    -h|--help) usage ;;
    --) shift; cmds+=("$@"); break ;;
    -*) echo "softroce-vm: unknown option $1" >&2; usage ;;
    *) cmds+=("$1"); shift ;;
  esac
done
[ ${#cmds[@]} -gt 0 ] || { echo "softroce-vm: no command to run" >&2; usage; }
case $vm_timeout in ''|*[!0-9]*) echo "softroce-vm: --timeout takes whole seconds" >&2; exit 2 ;; esac
case $cmd_timeout in ''|0|*[!0-9]*) echo "softroce-vm: --cmd-timeout takes whole seconds (at least 1)" >&2; exit 2 ;; esac
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }

# --- 1. Debian packages ------------------------------------------------------
pkgs=(qemu-system-x86 linux-image-amd64 ibverbs-providers rdma-core ibverbs-utils iproute2
      busybox-static cpio kmod libibverbs-dev librdmacm-dev libclang-dev pkg-config)
need=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  sudo=
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The newest installed Debian kernel that has rdma_rxe.
kver=
for v in $(ls /lib/modules | sort -V -r); do
  if [ -r "/boot/vmlinuz-$v" ] && modinfo -k "$v" -n rdma_rxe >/dev/null 2>&1; then kver=$v; break; fi
done
[ -n "$kver" ] || die "no installed kernel under /boot with the rdma_rxe module (install linux-image-amd64)"
[ -r "/boot/vmlinuz-$kver" ] || die "/boot/vmlinuz-$kver is not readable (run as root, or chmod it)"

# --- 2. The project's verbs binaries and test executables ---------------------
work=$root_dir/target/softroce
share=$work/share
mkdir -p "$work"
rm -rf "$share" "$work/initramfs"
mkdir -p "$share/bin" "$share/out"
listing=$work/build.json
if [ $build -eq 1 ] || [ ! -s "$listing" ]; then
  say "building the verbs binaries and test executables ($(elapsed))"
  cargo build --release --workspace --features verbs --bins
  cargo test --release --workspace --features verbs --no-run --message-format=json >"$listing.tmp"
  mv "$listing.tmp" "$listing"
fi
# PACKAGE-TARGET for tests, the plain name for binaries.
python3 - "$listing" <<'PY' >"$work/execs"
import json, sys
seen = set()
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable") if m.get("reason") == "compiler-artifact" else None
    if not exe:
        continue
    t = m["target"]
    # path+file:///dir/name#version, or path+file:///dir#name@version
    where, _, version = m["package_id"].partition("#")
    pkg = version.split("@")[0] if "@" in version else where.rstrip("/").split("/")[-1]
    name = t["name"] if "bin" in t["kind"] and not m["profile"]["test"] else f"{pkg}-{t['name']}"
    if name in seen:
        continue
    seen.add(name)
    print(name, exe)
PY
[ -s "$work/execs" ] || die "the build listed no executables"
while read -r name exe; do
  ln -f "$exe" "$share/bin/$name" 2>/dev/null || cp "$exe" "$share/bin/$name"
done <"$work/execs"

# --- 3. A minimal initramfs ----------------------------------------------------
say "building the initramfs for kernel $kver ($(elapsed))"
ird=$work/initramfs
mkdir -p "$ird"/{bin,dev,proc,sys,tmp,share,modules,etc/libibverbs.d,usr/lib/x86_64-linux-gnu/libibverbs,usr/lib64,usr/bin}
ln -s usr/lib "$ird/lib"
ln -s usr/lib64 "$ird/lib64"
cp /bin/busybox "$ird/bin/busybox"
# Kernel modules in load order. crc32_generic is not a declared dependency of
# rdma_rxe, but without it `rdma link add` fails (rxe cannot init crc32).
: >"$ird/modules/order"
for m in crc32_generic dummy rdma_rxe virtio_pci 9pnet_virtio 9p; do
  modprobe -S "$kver" --show-depends "$m" 2>/dev/null | while read -r kind path _; do
    [ "$kind" = insmod ] || continue
    f=$(basename "$path")
    grep -qx "$f" "$ird/modules/order" && continue
    cp "$path" "$ird/modules/$f"
    echo "$f" >>"$ird/modules/order"
  done
done
grep -q '^rdma_rxe' "$ird/modules/order" || die "could not resolve rdma_rxe's modules for $kver"
# Tools, the rxe provider, and every library they and the project's
# executables link.
tools=(/usr/bin/rdma /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong)
provider=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)
[ -n "$provider" ] || die "the rxe provider (ibverbs-providers) is missing"
for t in "${tools[@]}"; do cp "$t" "$ird/usr/bin/"; done
cp "$provider" "$ird/usr/lib/x86_64-linux-gnu/libibverbs/"
cp /etc/libibverbs.d/rxe.driver "$ird/etc/libibverbs.d/"
libs=$( { for f in "${tools[@]}" "$provider" "$share"/bin/*; do ldd "$f" 2>/dev/null || true; done; } |
        awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}' | sort -u)
for l in $libs; do
  case $l in /lib/*|/lib64/*) dst=/usr$l ;; *) dst=$l ;; esac
  mkdir -p "$ird$(dirname "$dst")"
  cp -L "$l" "$ird$dst"
done
printf '/usr/lib/x86_64-linux-gnu\n/usr/lib64\n' >"$ird/etc/ld.so.conf"
ldconfig -r "$ird" 2>/dev/null || true
cat >"$ird/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/share/bin:/usr/bin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
for m in $(cat /modules/order); do
  insmod /modules/$m || echo "guest: insmod $m failed"
done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 share /share || echo "guest: no 9p share"
if [ -f /share/guest-run ]; then
  /bin/sh /share/guest-run >/share/out/guest.log 2>&1
else
  echo "guest: /share/guest-run is missing"
fi
dmesg >/share/out/dmesg.log 2>&1
sync
poweroff -f
INIT
chmod +x "$ird/init"
(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initramfs.cpio.gz"

# --- 4. The guest's side: Soft-RoCE set-up, the commands, their statuses -------
printf '%s\n' "${cmds[@]}" >"$share/commands"
echo "$cmd_timeout" >"$share/cmd-timeout"
# The guest's helpers (with-blade, ...) join the executables.
for f in scripts/softroce/*; do cp "$f" "$share/bin/"; chmod +x "$share/bin/$(basename "$f")"; done
cat >"$share/guest-run" <<'RUN'
set -u
export OUT=/share/out SMART_RDMA_DEVICE=rxe0 HOME=/tmp RUST_BACKTRACE=1
ulimit -l unlimited
echo "guest: kernel $(uname -r), $(nproc) CPUs, clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
ip link set lo up
ip link set dummy0 up
ip addr add 10.0.0.1/24 dev dummy0
if ! rdma link add rxe0 type rxe netdev dummy0; then
  echo "guest: could not create rxe0"
  echo 1 >/share/out/setup.rc
  exit 1
fi
rdma link show
ibv_devices
# Sanity check of the device before the project's commands.
ibv_rc_pingpong -d rxe0 -g 1 -n 10 >/tmp/pp-server.log 2>&1 &
pp=$!
sleep 1
if ibv_rc_pingpong -d rxe0 -g 1 -n 10 10.0.0.1 >/tmp/pp-client.log 2>&1 && wait $pp; then
  echo "guest: ibv_rc_pingpong over rxe0 ok"
  echo 0 >/share/out/setup.rc
else
  echo "guest: ibv_rc_pingpong over rxe0 failed"; cat /tmp/pp-server.log /tmp/pp-client.log
  kill -KILL $pp 2>/dev/null
  echo 1 >/share/out/setup.rc
  exit 1
fi
ct=$(cat /share/cmd-timeout)
n=0
while IFS= read -r cmd; do
  n=$((n + 1))
  echo "guest: [$n] $cmd"
  start=$(cut -d' ' -f1 /proc/uptime)
  # Its own process group (setsid), so that a command past its time-out
  # is stopped with everything it started (blades included).
  ( cd /tmp && exec setsid sh -c "$cmd" ) </dev/null >/share/out/$n.log 2>&1 &
  cpid=$!
  # The watchdog in a process group of its own as well, so that stopping it
  # stops its sleep too (a killed subshell left its sleep running).
  setsid sh -c 'sleep "$1"; touch /tmp/timed-out.$3
    echo "guest: [$3] still running after $1s: SIGTERM to its processes"
    kill -TERM -- -"$2" 2>/dev/null; sleep 10; kill -KILL -- -"$2" 2>/dev/null' watchdog "$ct" "$cpid" "$n" &
  watch=$!
  wait $cpid
  rc=$?
  if [ -e /tmp/timed-out.$n ]; then
    # Past its time-out: let the watchdog SIGKILL what outlived SIGTERM.
    wait $watch
    rc=124
  else
    kill -- -$watch 2>/dev/null
  fi
  echo $rc >/share/out/$n.rc
  end=$(cut -d' ' -f1 /proc/uptime)
  echo "guest: [$n] exit $rc after $(awk "BEGIN{print $end - $start}") s"
done </share/commands
echo "guest: done"
RUN

# --- 5. The VM ----------------------------------------------------------------
say "booting the VM (kernel $kver, $smp CPUs, $mem, time-out ${vm_timeout}s) ($(elapsed))"
qemu_pid=
cleanup() {
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then kill -KILL "$qemu_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# clocksource=tsc tsc=reliable: the guest kernel finds TCG's TSCs
# unsynchronized and would keep time with the emulated hpet, making every
# clock read a system call and a device read. The runtimes read the clock
# often enough that a race-ht load then ran ~30x slower (and stalled for
# minutes with one thread). The TSC is read without a system call.
timeout --kill-after=10 "$vm_timeout" qemu-system-x86_64 \
  -accel tcg,thread=multi,tb-size=512 -cpu max -smp "$smp" -m "$mem" \
  -kernel "/boot/vmlinuz-$kver" -initrd "$work/initramfs.cpio.gz" \
  -append "console=ttyS0 panic=-1 loglevel=4 clocksource=tsc tsc=reliable" \
  -nic none -no-reboot -display none -monitor none -serial "file:$share/out/console.log" \
  -virtfs "local,path=$share,mount_tag=share,security_model=none,id=share" &
qemu_pid=$!
vm_rc=0
wait "$qemu_pid" || vm_rc=$?
qemu_pid=
[ $vm_rc -eq 124 ] && say "the VM hit its ${vm_timeout}s time-out"

# --- 6. Results -----------------------------------------------------------------
rm -rf "$out"
mkdir -p "$out"
cp -r "$share/out/." "$out/"
say "VM ended ($(elapsed)); logs and records in $out"
failed=0
if [ "$(cat "$out/setup.rc" 2>/dev/null)" != 0 ]; then
  say "Soft-RoCE set-up failed; see $out/guest.log and $out/console.log"
  [ -f "$out/guest.log" ] && sed 's/^/  /' "$out/guest.log" | tail -40
  exit 1
fi
for i in $(seq ${#cmds[@]}); do
  rc=$(cat "$out/$i.rc" 2>/dev/null || echo none)
  if [ "$rc" = 0 ]; then
    say "ok      [$i] ${cmds[$((i - 1))]}"
  else
    say "FAILED  [$i] ${cmds[$((i - 1))]} (exit $rc; $out/$i.log)"
    [ -f "$out/$i.log" ] && tail -30 "$out/$i.log" | sed 's/^/  /'
    failed=$((failed + 1))
  fi
done
grep -h "guest: \[" "$out/guest.log" 2>/dev/null | grep "exit" | sed 's/^/  /' || true
[ $failed -eq 0 ] || die "$failed of ${#cmds[@]} commands failed"
say "all ${#cmds[@]} commands passed"
