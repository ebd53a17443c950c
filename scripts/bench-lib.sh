# Sourced by the bench scripts that serve an array from member files in a folder.
#   bench_dir DIR   DIR refused on tmpfs (a memory figure), made and taken as absolute ($D);
#                   at exit the server on $D/s.sock is stopped and DIR removed
#   bench_cpu       the CPU line every figure names

bench_dir() {
    case "$(stat -f -c %T "$(dirname "$1")")" in
        tmpfs) echo "$1 is on tmpfs: a memory figure; use a disk" >&2; exit 2;;
    esac
    mkdir -p "$1"
    D=$(realpath "$1")
    trap bench_cleanup EXIT
}

bench_cleanup() {
    pkill -INT -f "serve --unix $D/s.sock" 2>/dev/null || true
    while pgrep -f "serve --unix $D/s.sock" >/dev/null; do sleep 0.2; done
    rm -rf "$D"
}

bench_cpu() {
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
}
