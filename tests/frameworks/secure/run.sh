#!/usr/bin/env bash
# Secure suite (issue 12): Sidekiq and BullMQ as restricted ACL users, over TLS.
#
# Makes throw-away certificates (a CA, a server certificate for localhost and 127.0.0.1, a
# client certificate, and a client certificate from another CA), then, per configuration
# (Kite at each of FW_THREADS, default "1 4"; FW_SERVER=redis: redis-server once):
#   - starts the server with a plain port and a TLS port (tls-auth-clients yes), the
#     default user behind a password (requirepass) and the user `sidekiq` from the
#     configuration file; creates the user `bullmq` with ACL SETUSER over the plain port;
#     both have Sidekiq's documented rules `+@all -@dangerous +info` on all keys and
#     channels;
#   - runs the BullMQ suite (../bullmq/suite.mjs, all 17 scenarios, prefix bull) over TLS
#     as `bullmq`, and the Sidekiq suite (../sidekiq/suite.rb, three sidekiq processes)
#     over TLS as `sidekiq`;
#   - then checks that the users really are restricted (FLUSHALL, FLUSHDB, KEYS, CONFIG,
#     ACL SETUSER, CLIENT LIST, SHUTDOWN, a FLUSHALL inside EVAL: all refused, the data
#     still there), that anonymous clients get NOAUTH on either port, and that the TLS port
#     answers no PONG to plain text, to a client without a certificate or with one from
#     another CA.
#
# Environment (besides ../lib.sh's KITE_BIN, FW_SERVER, FW_THREADS):
#   FW_SECURE_BULLMQ_SCENARIOS  BullMQ scenarios to run, by name (default: all)
#   FW_SECURE_ACL_RULES         the users' command rules (default "+@all -@dangerous +info")
#   FW_SECURE_SUITE_TIMEOUT     seconds each framework run may take (default 150)
# Exits non-zero on any failure.
set -euo pipefail
FW_NAME=secure
HERE="$(cd "$(dirname "$0")" && pwd)"
FW_DIR="$(dirname "$HERE")"
. "$FW_DIR/lib.sh"

# --- what it needs ------------------------------------------------------------------------
if ! command -v openssl >/dev/null 2>&1; then fw_apt_install openssl; fi
if ! command -v redis-cli >/dev/null 2>&1; then fw_apt_install redis-tools; fi
fw_npm_ci "$FW_DIR/bullmq"
if ! command -v sidekiq >/dev/null 2>&1 || ! ruby -e 'require "sidekiq"; require "redis"' >/dev/null 2>&1; then
    fw_apt_install ruby-sidekiq ruby-redis
fi
if [ "$FW_SERVER" = "redis" ]; then
    command -v redis-server >/dev/null 2>&1 || fw_apt_install redis-server
elif [ ! -x "$KITE_BIN" ]; then
    echo "Kite binary not found at $KITE_BIN: cargo build --release" >&2
    exit 1
fi

BULLMQ_SCENARIOS="${FW_SECURE_BULLMQ_SCENARIOS:-}"
ACL_RULES="${FW_SECURE_ACL_RULES:-+@all -@dangerous +info}"
SUITE_TIMEOUT="${FW_SECURE_SUITE_TIMEOUT:-150}"

TMP="$(mktemp -d -t fw-secure.XXXXXX)"
CHILD_PID=""
secure_cleanup() {
    # A framework run still going (interrupted): timeout passes the TERM on to its
    # process group (node, ruby and the sidekiq processes).
    if [ -n "$CHILD_PID" ]; then kill "$CHILD_PID" >/dev/null 2>&1 || true; fi
    fw_cleanup
    rm -rf "$TMP"
}
trap secure_cleanup EXIT
trap 'exit 130' INT TERM

T0=$SECONDS
FAILURES=()
fail() {
    FAILURES+=("${FW_CONFIG:-setup}: $1")
    echo "FAIL [${FW_CONFIG:-setup}] $1"
}
pass() { echo "PASS [${FW_CONFIG:-setup}] $1"; }

# --- certificates ---------------------------------------------------------------------------
# Version 3 certificates (rustls' webpki refuses v1): the CA with basicConstraints CA:TRUE,
# the others signed with -extfile. EC P-256 keys: quick to make. (Called as a condition, so
# `set -e` is off inside: the closing `openssl verify` of every certificate is the check.)
CERTS="$TMP/certs"
mkdir -p "$CERTS"
make_certs() (
    cd "$CERTS" || exit 1
    o() { timeout 30 openssl "$@" 2>>openssl.log; }
    newkey=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    # ca NAME: a self-signed CA.
    ca() {
        printf '%s\n' basicConstraints=critical,CA:TRUE keyUsage=critical,keyCertSign,cRLSign \
            subjectKeyIdentifier=hash >"$1.ext"
        o req -new "${newkey[@]}" -keyout "$1.key" -out "$1.csr" -subj "/CN=kite test $1"
        o x509 -req -in "$1.csr" -signkey "$1.key" -out "$1.crt" -days 2 -extfile "$1.ext"
    }
    # leaf NAME CA CN EXTENSION...: a certificate signed by CA.
    leaf() {
        local name="$1" ca="$2" cn="$3"
        shift 3
        printf '%s\n' "$@" >"$name.ext"
        o req -new "${newkey[@]}" -keyout "$name.key" -out "$name.csr" -subj "/CN=$cn"
        o x509 -req -in "$name.csr" -CA "$ca.crt" -CAkey "$ca.key" -set_serial "0x$(openssl rand -hex 8)" \
            -out "$name.crt" -days 2 -extfile "$name.ext"
    }
    ca ca
    leaf server ca localhost basicConstraints=CA:FALSE extendedKeyUsage=serverAuth \
        subjectAltName=DNS:localhost,IP:127.0.0.1
    leaf client ca "kite test client" basicConstraints=CA:FALSE extendedKeyUsage=clientAuth
    # A client certificate from a CA the server does not trust.
    ca rogue-ca
    leaf rogue-client rogue-ca "kite test rogue client" basicConstraints=CA:FALSE extendedKeyUsage=clientAuth
    o verify -CAfile ca.crt server.crt client.crt >/dev/null &&
        o verify -CAfile rogue-ca.crt rogue-client.crt >/dev/null
)
if ! make_certs; then
    echo "making the certificates failed:" >&2
    cat "$CERTS/openssl.log" >&2 || true
    exit 1
fi
export KITE_TLS_CA="$CERTS/ca.crt" KITE_TLS_CERT="$CERTS/client.crt" KITE_TLS_KEY="$CERTS/client.key"

ADMIN_PW="$(openssl rand -hex 16)"
SIDEKIQ_PW="$(openssl rand -hex 16)"
BULLMQ_PW="$(openssl rand -hex 16)"

# --- servers ----------------------------------------------------------------------------------
# start_server THREADS: sets PORT, TLS_PORT, SERVER_PID, LOG; waits for PONG on the plain
# port (as the default user).
start_server() {
    local threads="$1" data conf
    PORT="$(fw_free_port)"
    TLS_PORT="$(fw_free_port)"
    while [ "$TLS_PORT" = "$PORT" ]; do TLS_PORT="$(fw_free_port)"; done
    data="$TMP/data-$threads"
    mkdir -p "$data"
    LOG="$TMP/server-$threads.log"
    # The configuration file (first argument, as redis-server takes it): the default
    # user's password, and sidekiq as a `user` line. bullmq comes by ACL SETUSER.
    conf="$TMP/server-$threads.conf"
    {
        echo "requirepass $ADMIN_PW"
        echo "user sidekiq on >$SIDEKIQ_PW ~* &* $ACL_RULES"
    } >"$conf"
    local -a common=(--port "$PORT" --bind 127.0.0.1 --tls-port "$TLS_PORT"
        --tls-cert-file "$CERTS/server.crt" --tls-key-file "$CERTS/server.key"
        --tls-ca-cert-file "$CERTS/ca.crt" --save "" --dir "$data")
    if [ "$FW_SERVER" = "redis" ]; then
        redis-server "$conf" "${common[@]}" --appendonly no >"$LOG" 2>&1 &
    else
        "$KITE_BIN" "$conf" "${common[@]}" --threads "$threads" >"$LOG" 2>&1 &
    fi
    SERVER_PID=$!
    FW_PIDS+=("$SERVER_PID")
    for _ in $(seq 1 100); do
        if [ "$(admin PING)" = "PONG" ]; then return 0; fi
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "server did not start:" >&2
    cat "$LOG" >&2
    return 1
}

stop_server() {
    kill "$SERVER_PID" >/dev/null 2>&1 || true
    for _ in $(seq 1 100); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$SERVER_PID" >/dev/null 2>&1 || true
    wait "$SERVER_PID" 2>/dev/null || true
}

# redis-cli, bounded; stdout and stderr together.
cli() { timeout 5 redis-cli "$@" 2>&1; }
# The default user on the plain port.
admin() { cli -h 127.0.0.1 -p "$PORT" --user default --pass "$ADMIN_PW" --no-auth-warning "$@"; }
# The TLS port with the client certificate; as_user USER PASS CMD... also AUTHs.
tls_cli() {
    cli -h 127.0.0.1 -p "$TLS_PORT" --tls --cacert "$CERTS/ca.crt" \
        --cert "$CERTS/client.crt" --key "$CERTS/client.key" "$@"
}
as_user() {
    local user="$1" pw="$2"
    shift 2
    tls_cli --user "$user" --pass "$pw" --no-auth-warning "$@"
}

# expect WHAT REGEX CMD...: CMD's output must match REGEX (bash =~).
expect() {
    local what="$1" re="$2" out
    shift 2
    out="$("$@")" || true
    if [[ "$out" =~ $re ]]; then pass "$what"; else fail "$what: got '${out//$'\n'/ | }'"; fi
}
# expect_no_pong WHAT CMD...: CMD must not get PONG, nor hang until its timeout.
expect_no_pong() {
    local what="$1" out rc=0
    shift
    out="$("$@")" || rc=$?
    if [ "$rc" -eq 124 ]; then
        fail "$what: no answer and no close within 5 s"
    elif [[ "$out" == *PONG* ]]; then
        fail "$what: got PONG"
    else
        pass "$what (${out//$'\n'/ | })"
    fi
}

# timed WHAT CMD...: runs CMD, notes its duration, a failure on non-zero exit.
TIMINGS=()
timed() {
    local what="$1" t=$SECONDS rc=0
    shift
    "$@" || rc=$?
    TIMINGS+=("$FW_CONFIG, $what: $((SECONDS - t)) s")
    if [ "$rc" -ne 0 ]; then
        fail "$what (exit $rc$([ "$rc" -eq 124 ] && echo ", timed out after $SUITE_TIMEOUT s"))"
        return 1
    fi
}

# bounded CMD...: CMD under `timeout SUITE_TIMEOUT`, waited for in the background so that
# a signal to this script (Ctrl-C, a cancelled CI job) ends it at once; the EXIT trap then
# stops CMD.
bounded() {
    local rc=0
    timeout -k 5 "$SUITE_TIMEOUT" "$@" &
    CHILD_PID=$!
    wait "$CHILD_PID" || rc=$?
    CHILD_PID=""
    return "$rc"
}

run_bullmq() {
    # shellcheck disable=SC2086
    bounded node "$FW_DIR/bullmq/suite.mjs" "rediss://bullmq:$BULLMQ_PW@127.0.0.1:$TLS_PORT" bull $BULLMQ_SCENARIOS
}
# The suite keeps its sidekiq processes' logs in a temporary folder when it fails: under
# $TMP, shown here, then removed with it.
run_sidekiq() {
    local rc=0 f
    TMPDIR="$TMP" bounded ruby "$FW_DIR/sidekiq/suite.rb" "rediss://sidekiq:$SIDEKIQ_PW@127.0.0.1:$TLS_PORT" || rc=$?
    if [ "$rc" -ne 0 ]; then
        for f in "$TMP"/kite-sidekiq-*/sidekiq*.log; do
            [ -f "$f" ] || continue
            fw_log "end of $(basename "$f"):"
            tail -n 15 "$f" >&2
        done
    fi
    rm -rf "$TMP"/kite-sidekiq-*
    return "$rc"
}

# After the framework runs: the users are restricted, the TLS port wants TLS and a
# client certificate from the CA, anonymous clients get nothing.
check_restrictions() {
    expect "canary key written by the default user" '^OK$' admin SET fwsec:canary alive
    local before
    before="$(admin DBSIZE)"
    local user pw
    for user in sidekiq bullmq; do
        if [ "$user" = sidekiq ]; then pw="$SIDEKIQ_PW"; else pw="$BULLMQ_PW"; fi
        expect "$user: ACL WHOAMI over TLS" "^$user\$" as_user "$user" "$pw" ACL WHOAMI
        expect "$user: INFO allowed (+info)" 'redis_version:' as_user "$user" "$pw" INFO server
        expect "$user: wrong password refused" 'WRONGPASS' as_user "$user" "wrong-$pw" PING
        expect "$user: FLUSHALL refused" '^NOPERM' as_user "$user" "$pw" FLUSHALL
        expect "$user: FLUSHDB refused" '^NOPERM' as_user "$user" "$pw" FLUSHDB
        expect "$user: KEYS * refused" '^NOPERM' as_user "$user" "$pw" KEYS '*'
        expect "$user: CONFIG SET refused" '^NOPERM' as_user "$user" "$pw" CONFIG SET maxmemory 1
        expect "$user: CONFIG GET refused" '^NOPERM' as_user "$user" "$pw" CONFIG GET requirepass
        expect "$user: ACL SETUSER refused" '^NOPERM' as_user "$user" "$pw" ACL SETUSER "$user" +@all
        expect "$user: CLIENT LIST refused" '^NOPERM' as_user "$user" "$pw" CLIENT LIST
        # A script runs with its caller's permissions. Redis 7.0 answers "ERR The user
        # executing the script can't run this command or subcommand", 7.2 (and Kite) "ERR
        # ACL failure in script: User ... has no permissions to run the 'flushall' command".
        expect "$user: FLUSHALL inside EVAL refused" "can't run this command|ACL failure in script" \
            as_user "$user" "$pw" EVAL "return redis.call('flushall')" 0
    done
    expect "canary key survived" '^alive$' admin GET fwsec:canary
    expect "nothing flushed (DBSIZE $before)" "^$before\$" admin DBSIZE
    expect "ACL LOG names sidekiq" 'sidekiq' admin ACL LOG 100
    expect "ACL LOG names bullmq" 'bullmq' admin ACL LOG 100
    expect "ACL USERS lists sidekiq (configuration file)" 'sidekiq' admin ACL USERS
    expect "ACL USERS lists bullmq (ACL SETUSER)" 'bullmq' admin ACL USERS
    # Anonymous clients: the default user has a password.
    expect "anonymous PING on the plain port: NOAUTH" '^NOAUTH' cli -h 127.0.0.1 -p "$PORT" PING
    expect "anonymous PING over TLS: NOAUTH" '^NOAUTH' tls_cli PING
    # The TLS port.
    expect_no_pong "plain text on the TLS port" cli -h 127.0.0.1 -p "$TLS_PORT" \
        --user sidekiq --pass "$SIDEKIQ_PW" --no-auth-warning PING
    expect_no_pong "TLS without a client certificate" cli -h 127.0.0.1 -p "$TLS_PORT" --tls \
        --cacert "$CERTS/ca.crt" --user sidekiq --pass "$SIDEKIQ_PW" --no-auth-warning PING
    expect_no_pong "TLS with a client certificate from another CA" cli -h 127.0.0.1 -p "$TLS_PORT" \
        --tls --cacert "$CERTS/ca.crt" --cert "$CERTS/rogue-client.crt" --key "$CERTS/rogue-client.key" \
        --user sidekiq --pass "$SIDEKIQ_PW" --no-auth-warning PING
    # Last: if it were allowed, nothing after it could run.
    expect "sidekiq: SHUTDOWN refused" '^NOPERM' as_user sidekiq "$SIDEKIQ_PW" SHUTDOWN NOSAVE
    expect "bullmq: SHUTDOWN refused" '^NOPERM' as_user bullmq "$BULLMQ_PW" SHUTDOWN NOSAVE
    expect "server still up after all that" '^PONG$' admin PING
}

for threads in $(fw_configs); do
    if [ "$FW_SERVER" = "redis" ]; then FW_CONFIG="redis-server"; else FW_CONFIG="kite --threads $threads"; fi
    export FW_CONFIG
    if ! start_server "$threads"; then
        fail "server did not start"
        continue
    fi
    fw_log "$FW_CONFIG: port $PORT, TLS port $TLS_PORT"
    ok=1
    # bullmq by ACL SETUSER (sidekiq came from the configuration file).
    # shellcheck disable=SC2086
    expect "ACL SETUSER bullmq" '^OK$' admin ACL SETUSER bullmq on ">$BULLMQ_PW" '~*' '&*' $ACL_RULES
    fw_log "$FW_CONFIG: BullMQ over TLS as bullmq (${BULLMQ_SCENARIOS:-all scenarios})"
    timed "BullMQ suite" run_bullmq || ok=0
    fw_log "$FW_CONFIG: Sidekiq over TLS as sidekiq"
    timed "Sidekiq suite" run_sidekiq || ok=0
    fw_log "$FW_CONFIG: restrictions"
    check_restrictions
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        fail "the server exited"
        ok=0
    fi
    if [ "$ok" -eq 0 ] || [ "${#FAILURES[@]}" -gt 0 ]; then
        fw_log "end of the server log ($FW_CONFIG):"
        tail -n 30 "$LOG" >&2 || true
    fi
    stop_server
done

printf '%s\n' "${TIMINGS[@]}" | sed 's/^/==> [secure] time: /' >&2
if [ "${#FAILURES[@]}" -gt 0 ]; then
    fw_log "${#FAILURES[@]} failure(s) in $((SECONDS - T0)) s:"
    printf '  %s\n' "${FAILURES[@]}" >&2
    exit 1
fi
fw_log "all configurations passed in $((SECONDS - T0)) s"
