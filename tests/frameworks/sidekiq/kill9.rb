# Sidekiq durability check: kill -9 the server in the middle of a workload, restart it on
# the same data, and check that no acknowledged job was lost.
#
# Usage: ruby kill9.rb redis://127.0.0.1:PORT, with FW_STATE and FW_LIB in the environment
# (lib.sh's fw_start_durable_server: appendonly yes, appendfsync always, which promises
# that no reply to a write leaves the server before the write is on disk). KILL9_SEED=N
# replays a run (the seed picks the moment of the kill); every run prints its seed.
#
# Two real `sidekiq` processes (kill9_jobs.rb: a job that records its jid in k9:done, and
# a reliable fetch, see there) work the default queue while two client threads push jobs
# (Sidekiq::Client#push singly, some scheduled 2.5 s ahead, some failing once; push_bulk)
# and record every jid a push returned. The pushers pause between pushes, so that the
# backlog stays about what the processes can work off: Ruby on a small CI machine runs a
# few hundred of these jobs a second, and the check should take seconds. At a seeded
# moment 300-1500 ms in, the server gets SIGKILL; pushes stop, the processes' calls fail
# and they carry on once it is back.
# After `lib.sh restart` (same port, same --dir, PONG rather than -LOADING) and the
# processes' shutdown (so nothing moves while we look):
#   1. every acknowledged jid is in the queue, a process's in-progress list, the schedule,
#      retry or dead set, or k9:done;
#   2. every jid whose completion was acknowledged (the process logged it after its SADD to
#      k9:done returned) is in k9:done;
#   3. once the in-progress lists are put back on the queue, the retries retried and a
#      fresh process has run, every acknowledged jid is in k9:done (at least once);
#   4. no job whose completion was acknowledged is back on the queue (unless a process put
#      it back at shutdown): a job runs only after the fetch (BLMOVE) that took it off the
#      queue returned, so finding it there again means the restarted server lost that
#      acknowledged BLMOVE while keeping the later SADD: a state that never existed.
# Scheduled jobs and retries come due no earlier than 2 s after the start, after the kill:
# Sidekiq's poller takes a due job off its set and then pushes it, two steps a crash can
# separate on Redis as well, so that window is kept out of the check.
require "json"
require "tmpdir"
require "fileutils"
require "set"
require "sidekiq"
require "sidekiq/api"

URL = ARGV[0] or abort("usage: FW_STATE=DIR FW_LIB=lib.sh ruby kill9.rb redis://127.0.0.1:PORT")
STATE = ENV.fetch("FW_STATE")
LIB = ENV.fetch("FW_LIB")
LABEL = ENV.fetch("FW_CONFIG", "server")
Sidekiq.configure_client { |c| c.redis = { url: URL, size: 4 } }
# The pushers' own client never reconnects and resends (redis-rb resends a command whose
# connection broke, reply or not): a push goes to the server once, so a job is never on
# the queue twice (check 4 relies on it).
PUSHER = Sidekiq::Client.new(ConnectionPool.new(size: 2, timeout: 5) { Redis.new(url: URL, reconnect_attempts: 0) })
Sidekiq.logger.level = Logger::WARN
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)
$stdout.sync = true

class Failure < StandardError; end

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

T0 = now
def since = format("%d ms", (now - T0) * 1000)

def wait_for(what, timeout:, every: 0.2)
  deadline = now + timeout
  last = nil
  loop do
    begin
      last = yield
      return last if last
    rescue StandardError => e
      last = "error: #{e.class}: #{e.message}"
    end
    raise Failure, "timed out after #{timeout} s waiting for #{what} (last: #{last.inspect})" if now > deadline

    sleep every
  end
end

def redis(&blk) = Sidekiq.redis(&blk)

SEED = (ENV["KILL9_SEED"] || Random.new_seed % 2**32).to_i
RNG = Random.new(SEED)
KILL_AFTER = 0.3 + RNG.rand * 1.2
puts format("kill9 [%s]: seed %d (KILL9_SEED=%d replays it), kill after %d ms", LABEL, SEED, SEED, KILL_AFTER * 1000)

# --- the processes --------------------------------------------------------------------
JOBS = File.expand_path("kill9_jobs.rb", __dir__)
LOGDIR = Dir.mktmpdir("kite-sidekiq-kill9-")
$procs = []

def start_process(tag, concurrency: 5)
  log = File.join(LOGDIR, "#{tag}.log")
  pid = Process.spawn({ "REDIS_URL" => URL, "KILL9_LOG_DIR" => LOGDIR }, "sidekiq", "-r", JOBS, "-q", "default",
                      "-c", concurrency.to_s, "-t", "5", "-g", tag, out: [log, "w"], err: %i[child out])
  p = { pid: pid, tag: tag, log: log, status: nil }
  $procs << p
  p
end

# TERM (Sidekiq quiets, waits up to -t 5 s for its jobs, requeues the rest); KILL after 20 s.
def stop_processes(procs)
  procs.each { |p| Process.kill("TERM", p[:pid]) unless p[:status] }
  deadline = now + 20
  procs.each do |p|
    until p[:status]
      _, st = Process.wait2(p[:pid], Process::WNOHANG)
      p[:status] = st if st
      break if st || now > deadline

      sleep 0.1
    end
    next if p[:status]

    Process.kill("KILL", p[:pid])
    _, p[:status] = Process.wait2(p[:pid])
    puts "  #{p[:tag]} did not stop within 20 s of TERM; killed"
  end
end

at_exit do
  $procs.each do |p|
    next if p[:status]

    begin
      Process.kill("KILL", p[:pid])
      Process.wait(p[:pid])
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end
  end
end

def jids_of(payloads) = payloads.map { |j| JSON.parse(j)["jid"] }

def processing_keys
  keys = []
  cursor = "0"
  loop do
    cursor, batch = redis { |r| r.scan(cursor, match: "k9:processing:*", count: 1000) }
    keys.concat(batch)
    break if cursor == "0"
  end
  keys.uniq
end

# Where each jid is now: queue, in progress, schedule, retry, dead, done.
def locate
  places = Hash.new { |h, k| h[k] = [] }
  redis do |r|
    jids_of(r.lrange("queue:default", 0, -1)).each { |j| places[j] << :queue }
    processing_keys.each { |k| jids_of(r.lrange(k, 0, -1)).each { |j| places[j] << :in_progress } }
    %w[schedule retry dead].each { |set| jids_of(r.zrange(set, 0, -1)).each { |j| places[j] << set.to_sym } }
    r.smembers("k9:done").each { |j| places[j] << :done }
  end
  places
end

def some(xs) = xs.first(10).join(", ") + (xs.size > 10 ? ", ..." : "")

# --- the run --------------------------------------------------------------------------
acked = {} # jid -> [kind, ms since the start when the push returned]
ack_lock = Mutex.new
errors = Hash.new(0)
$killed = false
problems = []

begin
  first = [start_process("k9-a"), start_process("k9-b")]
  wait_for("2 sidekiq processes in ProcessSet", timeout: 30) { Sidekiq::ProcessSet.new.size == 2 }

  t_start = now
  record = lambda do |jid, kind|
    ack_lock.synchronize { acked[jid] = [kind, ((now - t_start) * 1000).round] } if jid
  end
  pushers = [
    Thread.new do
      n = 0
      until $killed
        begin
          n += 1
          kind = n % 10 == 0 ? :flaky : (n % 5 == 0 ? :scheduled : :single)
          item = { "class" => "Kill9Job", "args" => [n, kind == :flaky] }
          item["at"] = Time.now.to_f + 2.5 if kind == :scheduled
          record.call(PUSHER.push(item), kind)
          sleep 0.005
        rescue StandardError => e
          errors["#{e.class}: #{e.message[0, 100]}"] += 1
          sleep 0.02 unless $killed
        end
      end
    end,
    Thread.new do
      n = 0
      until $killed
        begin
          args = (0...10).map { |k| [n + k, false] }
          n += 10
          jids = PUSHER.push_bulk("class" => "Kill9Job", "args" => args)
          jids.each { |jid| record.call(jid, :bulk) }
          sleep 0.02
        rescue StandardError => e
          errors["#{e.class}: #{e.message[0, 100]}"] += 1
          sleep 0.02 unless $killed
        end
      end
    end,
  ]

  sleep KILL_AFTER
  pid = File.read(File.join(STATE, "pid")).to_i
  $killed = true
  Process.kill("KILL", pid)
  done_logged = Dir.glob(File.join(LOGDIR, "done-*.log")).sum { |f| File.readlines(f).size }
  puts "  #{since}: SIGKILL to pid #{pid}: #{ack_lock.synchronize { acked.size }} pushes and " \
       "#{done_logged} completions acknowledged so far"

  t_restart = now
  out = IO.popen(["bash", LIB, "restart"], err: %i[child out], &:read)
  raise Failure, "restart failed: #{out.strip}" unless $?.success?

  puts "  #{since}: restarted as pid #{out.strip} in #{((now - t_restart) * 1000).round} ms (PONG)"
  pushers.each do |t|
    raise Failure, "a pusher did not finish within 30 s of the restart" unless t.join(30)
  end
  stop_processes(first)

  # 1 and 2: nothing moves now.
  places = locate
  done_acked = Dir.glob(File.join(LOGDIR, "done-*.log")).flat_map { |f| File.readlines(f, chomp: true) }.uniq
  tally = Hash.new(0)
  acked.each_key { |jid| tally[places[jid].first || :missing] += 1 }
  puts "  #{since}: #{acked.size} pushes and #{done_acked.size} completions acknowledged in all; " \
       "where the pushed jobs are: #{tally.sort.to_h}"
  lost = acked.keys.select { |jid| places[jid].empty? }
  unless lost.empty?
    problems << "#{lost.size} acknowledged pushes lost: " +
                some(lost.map { |j| "#{j} (#{acked[j][0]}, acknowledged at #{acked[j][1]} ms)" })
  end
  undone = done_acked.reject { |jid| places[jid].include?(:done) }
  problems << "#{undone.size} acknowledged completions undone (not in k9:done): #{some(undone)}" unless undone.empty?
  requeued = Dir.glob(File.join(LOGDIR, "requeued-*.log")).flat_map { |f| File.readlines(f, chomp: true) }.to_set
  back = done_acked.select { |jid| places[jid].include?(:queue) && !requeued.include?(jid) }
  unless back.empty?
    problems << "#{back.size} jobs whose completion was acknowledged are back on queue:default, so the " \
                "acknowledged BLMOVE queue:default -> k9:processing:<pid> that fetched each is missing from " \
                "the restarted server's data: #{some(back.map { |j| "#{j} (#{places[j].join("+")})" })}"
  end
  raise Failure, problems.join("; ") unless problems.empty?

  # 3: in-progress lists back on the queue; retries and scheduled jobs now rather than
  # after their jitter and the poller's random start-up wait (up to 5 s); one fresh
  # process runs the rest.
  processing_keys.each do |k|
    n = redis { |r| r.llen(k) }
    n.times { redis { |r| r.lmove(k, "queue:default", "RIGHT", "RIGHT") } }
  end
  Sidekiq::RetrySet.new.retry_all
  Sidekiq::ScheduledSet.new.each(&:add_to_queue)
  drainer = start_process("k9-drain", concurrency: 10)
  begin
    wait_for("every acknowledged job done", timeout: 45) do
      done = redis { |r| r.smembers("k9:done") }.to_set
      acked.keys.all? { |j| done.include?(j) }
    end
    puts "  #{since}: all #{acked.size} acknowledged jobs done"
  rescue Failure => e
    done = redis { |r| r.smembers("k9:done") }.to_set
    left = acked.keys.reject { |j| done.include?(j) }
    where = locate
    raise Failure, "#{e.message}; #{left.size} not done: #{some(left.map { |j| "#{j} (#{where[j].join("+")})" })}"
  ensure
    stop_processes([drainer])
  end
  puts format("PASS kill9 [%s] seed %d (%s)", LABEL, SEED, since)
  status = 0
rescue Failure => e
  puts format("FAIL kill9 [%s] seed %d: %s", LABEL, SEED, e.message)
  status = 1
rescue StandardError => e
  puts format("FAIL kill9 [%s] seed %d: %s: %s\n  %s", LABEL, SEED, e.class, e.message, e.backtrace.first(5).join("\n  "))
  status = 1
end

unless errors.empty?
  top = errors.sort_by { |_, n| -n }.first(5).map { |m, n| "#{n}x #{m}" }
  puts "  client errors (expected around the kill): #{top.join(" | ")}"
end
# The processes log their failed calls around the kill ("Internal exception!", "Error
# fetching job"): expected. These would be the fetch strategy's own troubles.
bad = $procs.flat_map do |p|
  next [] unless File.exist?(p[:log])

  File.readlines(p[:log]).grep(/kill9:|NoMethodError|NameError|ArgumentError|TypeError/).first(3).map { |l| "#{p[:tag]}: #{l.strip[0, 300]}" }
end
puts "  from the sidekiq logs: #{bad.first(5).join(" | ")}" unless bad.empty?
if status.zero?
  FileUtils.rm_rf(LOGDIR)
else
  puts "  sidekiq logs in #{LOGDIR}"
end
exit(status)
