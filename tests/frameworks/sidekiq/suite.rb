# Sidekiq against a Redis-protocol server: ruby suite.rb redis://127.0.0.1:PORT
# (or rediss://USER:PASS@127.0.0.1:PORT: TLS as an ACL user, see KiteTLS in jobs.rb)
#
# Starts three real `sidekiq` processes (four threads each), pushes jobs singly and with
# push_bulk, scheduled, failing-then-retried and always-failing jobs, then checks what
# ran (each job exactly once, recorded in Redis by the job itself), the API's view
# (Stats, Queue, ScheduledSet, RetrySet, DeadSet, ProcessSet), heartbeats, quiet (TSTP
# and the API's quiet!) and shutdown (TERM and the API's stop!). Sidekiq's poller and
# heartbeat swallow their errors, so outcomes are checked, and the processes' logs are
# searched for the errors they logged.
require "json"
require "tmpdir"
require "sidekiq"
require "sidekiq/api"
require_relative "jobs"

URL = ARGV[0] or abort("usage: ruby suite.rb redis://127.0.0.1:PORT")
LABEL = ENV.fetch("FW_CONFIG", "server")
REDIS_OPTS = { url: URL, size: 4 }
SSL_PARAMS = KiteTLS.ssl_params(URL)
REDIS_OPTS[:ssl_params] = SSL_PARAMS if SSL_PARAMS
Sidekiq.configure_client { |c| c.redis = REDIS_OPTS }
Sidekiq.logger.level = Logger::WARN

class Failure < StandardError; end

$failures = 0

def check(cond, msg)
  raise Failure, msg unless cond
end

def check_eq(actual, expected, what)
  raise Failure, "#{what}: expected #{expected.inspect}, got #{actual.inspect}" unless actual == expected
end

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

# Polls the block until it returns a truthy value; the last value seen goes into the
# error message.
def wait_for(what, timeout: 60, every: 0.1)
  deadline = now + timeout
  last = nil
  loop do
    begin
      last = yield
      return last if last
    rescue Failure
      raise
    rescue StandardError => e
      last = "error: #{e.class}: #{e.message}"
    end
    raise Failure, "timed out after #{timeout} s waiting for #{what} (last: #{last.inspect})" if now > deadline

    sleep every
  end
end

def scenario(name)
  t0 = now
  yield
  puts format("PASS [%s] %s (%.1f s)", LABEL, name, now - t0)
rescue Failure => e
  $failures += 1
  puts "FAIL [#{LABEL}] #{name}: #{e.message}"
rescue StandardError => e
  $failures += 1
  puts "FAIL [#{LABEL}] #{name}: #{e.class}: #{e.message}\n  #{e.backtrace.first(5).join("\n  ")}"
end
$stdout.sync = true

def redis(&blk) = Sidekiq.redis(&blk)

def hash_num(key)
  redis { |r| r.hgetall(key) }.transform_values(&:to_f)
end

def exactly_once(set, ids)
  exec = hash_num("kt:exec:#{set}")
  missing = ids.map(&:to_s) - exec.keys
  check(missing.empty?, "#{set}: #{missing.size} jobs never ran (#{missing.first(5).join(", ")}...)")
  extra = exec.keys - ids.map(&:to_s)
  check(extra.empty?, "#{set}: unknown jobs ran: #{extra.first(5)}")
  more = exec.reject { |_, v| v == 1 }
  check(more.empty?, "#{set}: jobs ran more than once: #{more.first(5).to_h}")
end

# --- the processes --------------------------------------------------------------------
JOBS = File.expand_path("jobs.rb", __dir__)
LOGDIR = Dir.mktmpdir("kite-sidekiq-")
PROCS = (0...3).map do |i|
  log = File.join(LOGDIR, "sidekiq#{i}.log")
  pid = Process.spawn({ "REDIS_URL" => URL }, "sidekiq", "-r", JOBS, "-q", "critical,2", "-q", "default",
                      "-c", "4", "-t", "8", "-g", "kite#{i}", out: [log, "w"], err: [:child, :out])
  { pid: pid, log: log, tag: "kite#{i}", status: nil }
end

def reap(proc_, timeout)
  deadline = now + timeout
  while now < deadline
    _, st = Process.wait2(proc_[:pid], Process::WNOHANG)
    return proc_[:status] = st if st

    sleep 0.1
  end
  nil
end

at_exit do
  PROCS.each do |p|
    next if p[:status]

    begin
      Process.kill("KILL", p[:pid])
      Process.wait(p[:pid])
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end
  end
end

def process_entry(pr)
  Sidekiq::ProcessSet.new.find { |e| e["pid"] == pr[:pid] }
end

def pid_counts(set)
  redis { |r| r.hvals("kt:pid:#{set}") }.tally
end

# --- scenarios ------------------------------------------------------------------------
scenario("heartbeats: ProcessSet shows the 3 processes with their settings") do
  entries = wait_for("3 processes in ProcessSet") do
    ps = Sidekiq::ProcessSet.new.to_a
    ps.size == 3 && ps.all? { |e| e["beat"] } ? ps : nil
  end
  check_eq(entries.map { |e| e["pid"] }.sort, PROCS.map { |p| p[:pid] }.sort, "pids")
  entries.each do |e|
    check_eq(e["concurrency"], 4, "concurrency of #{e["identity"]}")
    check_eq(e["queues"].sort, %w[critical default], "queues of #{e["identity"]}")
    check_eq(e["quiet"], "false", "quiet of #{e["identity"]}")
    check((Time.now.to_f - e["beat"].to_f).abs < 60, "beat of #{e["identity"]}: #{e["beat"]}")
    check(PROCS.any? { |p| p[:tag] == e["tag"] && p[:pid] == e["pid"] }, "tag #{e["tag"]}")
  end
  check_eq(Sidekiq::ProcessSet.new.size, 3, "ProcessSet#size")
  check_eq(Sidekiq::ProcessSet.new.total_concurrency, 12, "total concurrency") if Sidekiq::ProcessSet.method_defined?(:total_concurrency)
  check_eq(Sidekiq::Stats.new.processes_size, 3, "Stats#processes_size")
end

# Everything is pushed at once; the scenarios below then check each kind.
SINGLE = (0...300).to_a
BULK = (0...1500).to_a
SCHED = (0...20).to_a
FAR = (0...5).to_a
FLAKY = (0...10).to_a
DEAD = (0...5).to_a
sched_at = {}
push_error = nil
begin
  SINGLE.each do |i|
    q = i.even? ? "default" : "critical"
    jid = CountJob.set(queue: q).perform_async("single", i)
    raise "perform_async returned #{jid.inspect}" unless jid.is_a?(String) && jid.size == 24
  end
  BULK.each_slice(500) do |slice|
    jids = Sidekiq::Client.push_bulk("class" => CountJob, "args" => slice.map { |i| ["bulk", i] })
    raise "push_bulk returned #{jids.size} jids for #{slice.size} jobs" unless jids.size == slice.size
  end
  SCHED.each do |i|
    secs = 1 + (i % 3)
    sched_at[i.to_s] = Time.now.to_f + secs
    CountJob.perform_in(secs, "sched", i)
  end
  FAR.each { |i| CountJob.perform_in(3600, "far", i) }
  FLAKY.each { |i| FlakyJob.perform_async(i) }
  DEAD.each { |i| DeadJob.perform_async(i) }
  ParkedRetryJob.perform_async(0)
rescue StandardError => e
  push_error = e
end

scenario("push: perform_async and push_bulk accepted every job") do
  raise Failure, "pushing failed: #{push_error.class}: #{push_error.message}" if push_error
end

scenario("exactly once: 300 jobs pushed singly + 1500 with push_bulk over 3 processes x 4 threads") do
  wait_for("1800 jobs run") do
    redis { |r| r.hlen("kt:exec:single") + r.hlen("kt:exec:bulk") } == 1800
  end
  wait_for("queues empty") { Sidekiq::Queue.new("default").size.zero? && Sidekiq::Queue.new("critical").size.zero? }
  exactly_once("single", SINGLE)
  exactly_once("bulk", BULK)
  by_pid = pid_counts("bulk").merge(pid_counts("single")) { |_, a, b| a + b }
  check(by_pid.size >= 2, "only #{by_pid.size} process(es) ran jobs: #{by_pid}")
  check((by_pid.keys.map(&:to_i) - PROCS.map { |p| p[:pid] }).empty?, "jobs ran in unknown processes: #{by_pid}")
end

scenario("scheduled: perform_in jobs come back through the scheduled poller, once each, not early") do
  far = Sidekiq::ScheduledSet.new.select { |e| e.args[0] == "far" }
  check_eq(far.map { |e| e.args[1] }.sort, FAR, "far jobs in the ScheduledSet")
  far.each { |e| check(e.at.to_f > Time.now.to_f + 3000, "far job at #{e.at}") }
  wait_for("20 scheduled jobs run") { redis { |r| r.hlen("kt:exec:sched") } == 20 }
  exactly_once("sched", SCHED)
  hash_num("kt:at:sched").each do |id, at|
    check(at >= sched_at[id] - 0.001, "scheduled job #{id} ran #{sched_at[id] - at} s early")
  end
  ss = Sidekiq::ScheduledSet.new
  check_eq(ss.size, FAR.size, "ScheduledSet size")
  ss.each { |e| e.delete if e.args[1].even? }
  check_eq(Sidekiq::ScheduledSet.new.size, 2, "ScheduledSet size after deleting 3")
  Sidekiq::ScheduledSet.new.clear
  check_eq(Sidekiq::ScheduledSet.new.size, 0, "ScheduledSet size after clear")
  check_eq(hash_num("kt:exec:far"), {}, "far jobs that ran")
end

scenario("retries: failing jobs come back through the retry poller and succeed once") do
  wait_for("10 flaky jobs succeed") { redis { |r| r.hlen("kt:exec:flaky") } == 10 }
  exactly_once("flaky", FLAKY)
  att = hash_num("kt:att:flaky")
  check_eq(att.values.uniq, [2.0], "attempts per flaky job")
  wait_for("no flaky job left in the RetrySet") { Sidekiq::RetrySet.new.none? { |e| e.klass == "FlakyJob" } }
end

scenario("dead set: jobs that exhaust their retry (retry: 1) land in the DeadSet") do
  wait_for("5 dead jobs") { Sidekiq::DeadSet.new.size == 5 }
  dead = Sidekiq::DeadSet.new.to_a
  check_eq(dead.map { |e| e.args[0] }.sort, DEAD, "dead job args")
  dead.each do |e|
    check_eq(e.klass, "DeadJob", "class")
    check_eq(e["error_message"], "dead #{e.args[0]} attempt 2", "error_message")
    check_eq(e["retry_count"], 1, "retry_count")
  end
  check_eq(hash_num("kt:att:dead").values.uniq, [2.0], "attempts per dead job")
  check(Sidekiq::RetrySet.new.none? { |e| e.klass == "DeadJob" }, "DeadJob still in the RetrySet")
  dead.first.delete
  check_eq(Sidekiq::DeadSet.new.size, 4, "DeadSet size after delete")
  Sidekiq::DeadSet.new.clear
  check_eq(Sidekiq::DeadSet.new.size, 0, "DeadSet size after clear")
  check_eq(hash_num("kt:att:dead").values.uniq, [2.0], "attempts per dead job")
end

scenario("RetrySet: a job waiting an hour is listed, then retried by hand") do
  # The flaky and dead jobs' retries have left the set by now (scenarios above).
  entry = wait_for("the parked job alone in the RetrySet") do
    rs = Sidekiq::RetrySet.new.to_a
    rs.size == 1 && rs[0].klass == "ParkedRetryJob" ? rs[0] : nil
  end
  check_eq(entry["retry_count"], 0, "retry_count")
  check_eq(entry["error_class"], "RuntimeError", "error_class")
  check_eq(entry["error_message"], "parked 0 attempt 1", "error_message")
  check(entry.at.to_f > Time.now.to_f + 3000, "retry at #{entry.at}")
  check_eq(Sidekiq::RetrySet.new.size, 1, "RetrySet size")
  check_eq(Sidekiq::RetrySet.new.find_job(entry.jid)&.jid, entry.jid, "find_job")
  entry.retry
  wait_for("the parked job succeeds") { redis { |r| r.hget("kt:exec:parked", "0") } == "1" }
  check_eq(hash_num("kt:att:parked"), { "0" => 2.0 }, "attempts")
  check_eq(Sidekiq::RetrySet.new.size, 0, "RetrySet size")
end

# Every execution so far: successes, plus failures (flaky 10, dead 10, parked 1).
PROCESSED = SINGLE.size + BULK.size + SCHED.size + 2 * FLAKY.size + 2 * DEAD.size + 2
FAILED = FLAKY.size + 2 * DEAD.size + 1

scenario("Stats: processed and failed counts (flushed by the heartbeats)") do
  begin
    wait_for("processed #{PROCESSED}, failed #{FAILED}") do
      s = Sidekiq::Stats.new
      s.processed >= PROCESSED && s.failed >= FAILED
    end
  rescue Failure
    nil # the check below shows the counts
  end
  st = Sidekiq::Stats.new
  check_eq([st.processed, st.failed], [PROCESSED, FAILED], "processed, failed")
  check_eq([st.enqueued, st.scheduled_size, st.retry_size, st.dead_size], [0, 0, 0, 0],
           "enqueued, scheduled, retry, dead sizes")
  check_eq(st.processes_size, 3, "processes_size")
  # Today's and yesterday's counters (the run may cross midnight UTC).
  recent = Sidekiq::Stats::History.new(2).processed.values.sum
  check_eq(recent, PROCESSED, "processed in Stats::History")
end

scenario("Queue API: size, find_job, latency, delete, clear on a queue nobody serves") do
  jids = (0...7).map { |i| CountJob.set(queue: "parked").perform_async("parked", i) }
  q = Sidekiq::Queue.new("parked")
  check_eq(q.size, 7, "size")
  check(Sidekiq::Queue.all.map(&:name).include?("parked"), "Queue.all: #{Sidekiq::Queue.all.map(&:name)}")
  check_eq(Sidekiq::Stats.new.queues["parked"], 7, "Stats#queues")
  job = q.find_job(jids[3])
  check_eq(job&.args, ["parked", 3], "args of find_job")
  check(q.latency >= 0 && q.latency < 3600, "latency #{q.latency}")
  check_eq(q.map(&:jid).sort, jids.sort, "jids listed")
  job.delete
  check_eq(q.size, 6, "size after delete")
  q.clear
  check_eq(Sidekiq::Queue.new("parked").size, 0, "size after clear")
  check(!Sidekiq::Queue.all.map(&:name).include?("parked"), "queue still listed after clear")
end

scenario("quiet: TSTP to one process, quiet! (API) to another; only the third runs new jobs") do
  a, b, c = PROCS
  Process.kill("TSTP", a[:pid])
  wait_for("process A quiet in ProcessSet") { process_entry(a)&.[]("quiet") == "true" }
  process_entry(b).quiet!
  wait_for("process B quiet in ProcessSet") { process_entry(b)&.[]("quiet") == "true" }
  check_eq(process_entry(c)["quiet"], "false", "process C quiet")
  ids = (0...200).to_a
  Sidekiq::Client.push_bulk("class" => CountJob, "args" => ids.map { |i| ["after_quiet", i] })
  wait_for("200 jobs run") { redis { |r| r.hlen("kt:exec:after_quiet") } == 200 }
  exactly_once("after_quiet", ids)
  check_eq(pid_counts("after_quiet"), { c[:pid].to_s => 200 }, "processes that ran jobs after quiet")
  check_eq(Sidekiq::ProcessSet.new.size, 3, "ProcessSet size (quiet processes stay)")
end

scenario("shutdown: TERM to two processes, stop! (API) to the third; all exit 0 and leave ProcessSet") do
  a, b, c = PROCS
  Process.kill("TERM", a[:pid])
  Process.kill("TERM", b[:pid])
  process_entry(c).stop!
  PROCS.each do |p|
    st = reap(p, 60)
    check(st, "process #{p[:tag]} (pid #{p[:pid]}) did not exit")
    check(st.exited? && st.exitstatus.zero?, "process #{p[:tag]} ended with #{st.inspect}")
  end
  wait_for("empty ProcessSet") { Sidekiq::ProcessSet.new.size.zero? }
  check_eq(redis { |r| r.scard("processes") }, 0, "processes set")
end

scenario("logs: no errors logged by the pollers, heartbeats or fetchers") do
  bad = PROCS.flat_map do |p|
    File.readlines(p[:log]).grep(/ERROR|Error fetching|heartbeat:/).map { |l| "#{p[:tag]}: #{l.strip}" }
  end
  check(bad.empty?, "#{bad.size} error lines, first: #{bad.first(3).join(" | ")}")
end

if $failures.zero?
  FileUtils.rm_rf(LOGDIR)
  puts "all scenarios passed [#{LABEL}]"
else
  puts "#{$failures} scenario(s) failed [#{LABEL}]; sidekiq logs in #{LOGDIR}"
end
exit($failures.zero? ? 0 : 1)
