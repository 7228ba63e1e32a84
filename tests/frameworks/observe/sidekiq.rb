# The observe suite's Sidekiq workload (see run.sh): ruby sidekiq.rb redis://127.0.0.1:PORT
#
# Pushes jobs with no Sidekiq process running, checks what KITE QUEUES (RESP2: one flat
# array per queue) and INFO queues say about them, then starts one real `sidekiq -c 2`
# that drains "default" and "critical" (not "low") and checks the counters after it. The
# Sidekiq process is left running, idle, its pid in $OBS_TMP/sidekiq.pid (run.sh stops it):
# the metrics and dashboard checks expect its fetchers blocked in BRPOP.
require "json"
require "securerandom"
require "sidekiq"
require "sidekiq/api"
require_relative "jobs"

URL = ARGV[0] or abort("usage: ruby sidekiq.rb redis://127.0.0.1:PORT")
LABEL = ENV.fetch("FW_CONFIG", "server")
TMP = ENV.fetch("OBS_TMP") { Dir.mktmpdir("kite-observe-") }
N_DEFAULT = Integer(ENV.fetch("OBS_SK_DEFAULT", "40"))
N_CRITICAL = Integer(ENV.fetch("OBS_SK_CRITICAL", "15"))
N_LOW = Integer(ENV.fetch("OBS_SK_LOW", "4"))
N_SCHEDULED = Integer(ENV.fetch("OBS_SK_SCHEDULED", "5"))
N_RETRY = Integer(ENV.fetch("OBS_SK_RETRY", "3"))
Sidekiq.configure_client { |c| c.redis = { url: URL, size: 2 } }
Sidekiq.logger.level = Logger::WARN
$stdout.sync = true

class Failure < StandardError; end

$failures = 0
$passed = 0

def check(cond, msg)
  raise Failure, msg unless cond
end

def check_eq(actual, expected, what)
  raise Failure, "#{what}: expected #{expected.inspect}, got #{actual.inspect}" unless actual == expected
end

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

# Polls the block until it returns a truthy value (a Failure inside counts as "not yet"
# until the deadline, then is raised with its message).
def wait_for(what, timeout: 15, every: 0.1)
  deadline = now + timeout
  last = nil
  loop do
    begin
      last = yield
      return last if last
    rescue Failure => e
      raise if now > deadline

      last = e.message
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
  $passed += 1
  puts format("PASS [%s] sidekiq: %s (%.1f s)", LABEL, name, now - t0)
rescue Failure => e
  $failures += 1
  puts "FAIL [#{LABEL}] sidekiq: #{name}: #{e.message}"
rescue StandardError => e
  $failures += 1
  puts "FAIL [#{LABEL}] sidekiq: #{name}: #{e.class}: #{e.message}\n  #{e.backtrace.first(5).join("\n  ")}"
end

# A connection of our own for KITE and INFO (redis-rb 4 speaks RESP2).
KITE = Redis.new(url: URL)

# A RESP2 map: a flat array of field, value pairs (a Hash is taken as it is).
def resp_map(x, what)
  return x if x.is_a?(Hash)

  check(x.is_a?(Array) && x.size.even?, "#{what}: not a map / flat array of pairs: #{x.inspect[0, 200]}")
  x.each_slice(2).to_h
end

def num(x) = x.nil? ? nil : Float(x)

# KITE QUEUES [pattern] as { name => fields }; also checks the reply's shape.
def kite_queues(pattern = nil)
  raw = KITE.call("KITE", "QUEUES", *[pattern].compact)
  check(raw.is_a?(Array), "KITE QUEUES: not an array: #{raw.inspect[0, 200]}")
  rows = raw.map do |e|
    m = resp_map(e, "KITE QUEUES entry")
    m["jobs"] = m["jobs"].nil? ? {} : resp_map(m["jobs"], "jobs of #{m["name"]}")
    m
  end
  names = rows.map { |m| m["name"] }
  check_eq(names, names.sort, "KITE QUEUES order (sorted by name)")
  rows.to_h { |m| [m["name"], m] }
end

def kite_queue(name, pattern = nil)
  q = kite_queues(pattern)[name]
  check(q, "KITE QUEUES has no #{name.inspect} (has #{kite_queues.keys.inspect})")
  q
end

def unescape(s) = s.gsub(/%([0-9A-Fa-f]{2})/) { Regexp.last_match(1).hex.chr }

# INFO queues as { "fields" => {...}, "rows" => [ {name=>..., ...} ], "frameworks" => {...} }.
def info_queues
  text = KITE.call("INFO", "queues")
  out = { "fields" => {}, "rows" => [], "frameworks" => {}, "text" => text }
  check(text.include?("# Queues"), "INFO queues has no '# Queues' section: #{text[0, 200].inspect}")
  text.each_line do |line|
    line = line.strip
    next if line.empty? || line.start_with?("#")

    key, value = line.split(":", 2)
    if key =~ /\Aqueue\d+\z/
      row = value.split(",").to_h { |kv| k, v = kv.split("=", 2); [k, unescape(v.to_s)] }
      row["_key"] = key
      out["rows"] << row
    elsif key.start_with?("framework_")
      out["frameworks"][key.delete_prefix("framework_")] = value.split(",").to_h { |kv| kv.split("=", 2) }
    else
      out["fields"][key] = value
    end
  end
  out
end

def check_counts(q, want)
  want.each { |field, v| check_eq(q[field], v, "#{q["name"]} #{field}") }
end

t_first_push = nil

scenario("enqueue with no Sidekiq process: #{N_DEFAULT} default, #{N_CRITICAL} critical, " \
         "#{N_LOW} low, #{N_SCHEDULED} scheduled in 1 h, #{N_RETRY} parked in the retry set") do
  t_first_push = now
  N_DEFAULT.times { |i| ObsJob.set(queue: "default").perform_async("default", i) }
  N_CRITICAL.times { |i| ObsJob.set(queue: "critical").perform_async("critical", i) }
  N_LOW.times { |i| ObsJob.set(queue: "low").perform_async("low", i) }
  N_SCHEDULED.times { |i| ObsJob.perform_in(3600, "scheduled", i) }
  # As Sidekiq's retry logic leaves a failed job: the payload plus the error, scored at
  # the retry time (an hour ahead, so the retry poller leaves them alone).
  N_RETRY.times do |i|
    t = Time.now.to_f
    Sidekiq::RetrySet.new.schedule(t + 3600,
                                   "class" => "ObsJob", "args" => ["retry", i], "queue" => "default",
                                   "jid" => SecureRandom.hex(12), "retry" => true, "retry_count" => 0,
                                   "created_at" => t, "enqueued_at" => t, "failed_at" => t,
                                   "error_class" => "RuntimeError", "error_message" => "retry #{i}")
  end
  check_eq([Sidekiq::Queue.new("default").size, Sidekiq::Queue.new("critical").size, Sidekiq::Queue.new("low").size],
           [N_DEFAULT, N_CRITICAL, N_LOW], "Sidekiq::Queue sizes (default, critical, low)")
  check_eq([Sidekiq::ScheduledSet.new.size, Sidekiq::RetrySet.new.size, Sidekiq::DeadSet.new.size],
           [N_SCHEDULED, N_RETRY, 0], "ScheduledSet, RetrySet, DeadSet sizes")
end

# The jobs wait ~1.5 s, so the oldest age is at least 1 s.
sleep([1.5 - (now - (t_first_push || now)), 0].max)

scenario("KITE QUEUES before any consumer: depth, pushed, oldest age, jobs (RESP2 flat arrays)") do
  qs = kite_queues
  d = qs["queue:default"] or raise Failure, "no queue:default in KITE QUEUES (has #{qs.keys.inspect})"
  c = qs["queue:critical"] or raise Failure, "no queue:critical in KITE QUEUES"
  l = qs["queue:low"] or raise Failure, "no queue:low in KITE QUEUES"
  [d, c, l].each do |q|
    check_counts(q, "framework" => "sidekiq", "type" => "list", "db" => 0, "popped" => 0, "consumers" => 0)
    check(q["wait_p50_ms"].nil? && q["wait_p99_ms"].nil?, "#{q["name"]}: wait quantiles before the first pop: " \
          "#{q["wait_p50_ms"].inspect}, #{q["wait_p99_ms"].inspect} (want null)")
    pr = num(q["push_rate"])
    check(pr && pr >= 0, "#{q["name"]} push_rate #{q["push_rate"].inspect}")
    check_eq(num(q["pop_rate"]), 0.0, "#{q["name"]} pop_rate")
  end
  check_counts(d, "depth" => N_DEFAULT, "pushed" => N_DEFAULT)
  check_counts(c, "depth" => N_CRITICAL, "pushed" => N_CRITICAL)
  check_counts(l, "depth" => N_LOW, "pushed" => N_LOW)
  check_eq(d["jobs"]["waiting"], N_DEFAULT, "queue:default jobs waiting")
  check_eq(c["jobs"]["waiting"], N_CRITICAL, "queue:critical jobs waiting")
  elapsed_ms = (now - t_first_push) * 1000
  [d, c].each do |q|
    age = q["oldest_age_ms"]
    check(age.is_a?(Integer) && age.between?(1000, 10_000), "#{q["name"]} oldest_age_ms #{age.inspect}: want 1000..10000")
    check(age <= elapsed_ms + 1000, "#{q["name"]} oldest_age_ms #{age} but the first push was #{elapsed_ms.round} ms ago")
  end
  check_eq(kite_queues("queue:*").keys, %w[queue:critical queue:default queue:low], "KITE QUEUES queue:*")
  check_eq(kite_queues("queue:d*").keys, %w[queue:default], "KITE QUEUES queue:d*")
  check_eq(kite_queues("nothing-like-this*").keys, [], "KITE QUEUES nothing-like-this*")
end

scenario("INFO queues: the rows, sorted by name, and framework_sidekiq scheduled/retry/dead") do
  info = info_queues
  check_eq(info["fields"]["queue_tracking"], "1", "queue_tracking")
  check(info["fields"]["queues_tracked"].to_i >= 3, "queues_tracked #{info["fields"]["queues_tracked"].inspect}")
  check_eq(info["fields"]["queues_overflow"], "0", "queues_overflow")
  names = info["rows"].map { |r| r["name"] }
  check_eq(names, names.sort, "INFO queues row order")
  check_eq(info["rows"].map { |r| r["_key"] }, (0...names.size).map { |i| "queue#{i}" }, "INFO queues row keys")
  d = info["rows"].find { |r| r["name"] == "queue:default" } or raise Failure, "no queue:default row: #{info["text"]}"
  check_counts(d, "framework" => "sidekiq", "type" => "list", "depth" => N_DEFAULT.to_s, "pushed" => N_DEFAULT.to_s,
                  "popped" => "0", "consumers" => "0", "jobs_waiting" => N_DEFAULT.to_s)
  check(d["oldest_age_ms"].to_i.between?(1000, 10_000), "queue:default oldest_age_ms #{d["oldest_age_ms"].inspect}")
  check_eq([d["wait_p50_ms"].to_f, d["wait_p99_ms"].to_f], [-1.0, -1.0], "queue:default wait quantiles before a pop")
  c = info["rows"].find { |r| r["name"] == "queue:critical" } or raise Failure, "no queue:critical row"
  check_counts(c, "depth" => N_CRITICAL.to_s, "pushed" => N_CRITICAL.to_s)
  sk = info["frameworks"]["sidekiq"] or raise Failure, "no framework_sidekiq line: #{info["text"]}"
  # Only these three are specified; other fields on the line (a db=, say) are allowed.
  check_eq(sk.slice("scheduled", "retry", "dead"),
           { "scheduled" => N_SCHEDULED.to_s, "retry" => N_RETRY.to_s, "dead" => "0" }, "framework_sidekiq")
  default_info = KITE.call("INFO")
  check(!default_info.include?("# Queues"), "the default INFO shows the Queues section")
  check(KITE.call("INFO", "all").include?("# Queues"), "INFO all has no Queues section")
end

# --- a real Sidekiq process drains default and critical --------------------------------
SIDEKIQ_LOG = File.join(TMP, "sidekiq.log")
sidekiq_pid = Process.spawn({ "REDIS_URL" => URL }, "sidekiq", "-r", File.expand_path("jobs.rb", __dir__),
                            "-q", "critical,2", "-q", "default", "-c", "2", "-t", "5",
                            out: [SIDEKIQ_LOG, "w"], err: %i[child out], pgroup: true)
Process.detach(sidekiq_pid)
File.write(File.join(TMP, "sidekiq.pid"), sidekiq_pid.to_s)

scenario("sidekiq -c 2 drains default and critical (#{N_DEFAULT + N_CRITICAL} jobs, each once)") do
  total = N_DEFAULT + N_CRITICAL
  wait_for("#{total} jobs run", timeout: 60) { KITE.hlen("kt-obs:exec") >= total }
  exec = KITE.hgetall("kt-obs:exec")
  check_eq(exec.size, total, "distinct jobs run")
  check(exec.values.all? { |v| v == "1" }, "jobs ran more than once: #{exec.reject { |_, v| v == "1" }.first(5)}")
  check(exec.keys.none? { |k| k.start_with?("low:") }, "a job of queue low ran")
  check_eq([Sidekiq::Queue.new("default").size, Sidekiq::Queue.new("critical").size, Sidekiq::Queue.new("low").size],
           [0, 0, N_LOW], "Sidekiq::Queue sizes after the drain")
end

scenario("KITE QUEUES after the drain: depth 0, pushed == popped == enqueued, wait times") do
  qs = kite_queues
  d = qs["queue:default"] or raise Failure, "no queue:default"
  c = qs["queue:critical"] or raise Failure, "no queue:critical"
  l = qs["queue:low"] or raise Failure, "no queue:low"
  check_counts(d, "depth" => 0, "pushed" => N_DEFAULT, "popped" => N_DEFAULT, "oldest_age_ms" => nil)
  check_counts(c, "depth" => 0, "pushed" => N_CRITICAL, "popped" => N_CRITICAL, "oldest_age_ms" => nil)
  check_counts(l, "depth" => N_LOW, "pushed" => N_LOW, "popped" => 0, "consumers" => 0,
                  "wait_p50_ms" => nil)
  check_eq(d["jobs"]["waiting"], 0, "queue:default jobs waiting")
  [d, c].each do |q|
    p50 = num(q["wait_p50_ms"])
    p99 = num(q["wait_p99_ms"])
    # Every job waited at least the 1.5 s above (plus Sidekiq's start).
    check(p50 && p50 >= 900 && p50 < 120_000, "#{q["name"]} wait_p50_ms #{q["wait_p50_ms"].inspect}: want >= ~1000")
    check(p99 && p99 >= p50, "#{q["name"]} wait_p99_ms #{q["wait_p99_ms"].inspect} (p50 #{p50})")
  end
  age = l["oldest_age_ms"]
  check(age.is_a?(Integer) && age >= 1500, "queue:low oldest_age_ms #{age.inspect}")
  check_eq((info_queues["frameworks"]["sidekiq"] || {}).slice("scheduled", "retry", "dead"),
           { "scheduled" => N_SCHEDULED.to_s, "retry" => N_RETRY.to_s, "dead" => "0" }, "framework_sidekiq")
end

scenario("consumers: the idle Sidekiq's fetchers, blocked in BRPOP, count on default and critical") do
  wait_for("consumers >= 1 on queue:default and queue:critical") do
    qs = kite_queues("queue:*")
    ok = qs["queue:default"]["consumers"] >= 1 && qs["queue:critical"]["consumers"] >= 1
    raise Failure, "consumers: #{qs.transform_values { |q| q["consumers"] }}" unless ok

    ok
  end
  check_eq(kite_queue("queue:low")["consumers"], 0, "queue:low consumers (nobody serves it)")
end

scenario("KITE QUEUE: one queue with history and the newest elements; null for no queue") do
  check_eq(KITE.call("KITE", "QUEUE", "no-such-queue"), nil, "KITE QUEUE no-such-queue")
  d = resp_map(KITE.call("KITE", "QUEUE", "queue:default"), "KITE QUEUE queue:default")
  check_eq([d["name"], d["framework"], d["depth"], d["pushed"], d["popped"]],
           ["queue:default", "sidekiq", 0, N_DEFAULT, N_DEFAULT], "KITE QUEUE queue:default name, framework, counts")
  check_eq(d["newest"], [], "newest of an empty queue")
  # docs/observe.md says "[unix_seconds, depth, pushed, popped]" of "the counters sampled
  # once a second": read either as the counters themselves (non-decreasing, the last
  # sample at the totals) or as what each second added (adding up to the totals; the
  # queue is younger than the 300 s kept). Both must show the drain.
  hist = wait_for("history of queue:default to show the drain", timeout: 5) do
    h = resp_map(KITE.call("KITE", "QUEUE", "queue:default"), "KITE QUEUE")["history"]
    raise Failure, "history is #{h.inspect[0, 200]}" unless h.is_a?(Array) && h.size >= 2 && h.all? { |e| e.is_a?(Array) && e.size == 4 }

    pushed = h.map { |e| e[2].to_i }
    popped = h.map { |e| e[3].to_i }
    cumulative = pushed.each_cons(2).all? { |a, b| a <= b } && popped.each_cons(2).all? { |a, b| a <= b } &&
                 [pushed.last, popped.last] == [N_DEFAULT, N_DEFAULT]
    per_second = [pushed.sum, popped.sum] == [N_DEFAULT, N_DEFAULT]
    unless h.last[1].to_i.zero? && (cumulative || per_second)
      raise Failure, "history neither counts up to nor adds up to #{N_DEFAULT} pushed and popped, " \
                     "ending at depth 0: #{h.last(8).inspect}"
    end

    h
  end
  ts = hist.map { |e| e[0].to_f }
  check_eq(ts, ts.sort, "history timestamps (oldest first)")
  check((ts.last - Time.now.to_f).abs < 60, "last history timestamp #{ts.last} vs now #{Time.now.to_f}")
  check(hist.size <= 301, "history longer than 300 s: #{hist.size} entries")
  check(hist.any? { |e| e[1].to_i == N_DEFAULT }, "history never shows depth #{N_DEFAULT}: #{hist.inspect[0, 300]}")
  l = resp_map(KITE.call("KITE", "QUEUE", "queue:low"), "KITE QUEUE queue:low")
  check_eq(l["newest"].size, N_LOW, "newest of queue:low (#{N_LOW} elements)")
  l["newest"].each do |e|
    check(e.bytesize <= 256, "newest element longer than 256 bytes: #{e.bytesize}")
    check(e.include?("ObsJob"), "newest element is not a job: #{e[0, 80].inspect}")
  end
end

puts "sidekiq: #{$passed} passed, #{$failures} failed [#{LABEL}] (the sidekiq process #{sidekiq_pid} stays for the next checks)"
exit($failures.zero? ? 0 : 1)
