# Sidekiq drain benchmark: push N no-op jobs per queue with Sidekiq::Client.push_bulk, then
# start one real `sidekiq` process per queue and time how long the queues take to empty
# (from the first job taken to the last). Prints one JSON object.
#
# ruby drain.rb --host 127.0.0.1 --port 6379 [--pid PID] [--queues 1] [--jobs 20000]
#               [--concurrency 10] [--max-seconds 120]
require "json"
require "optparse"
require "tmpdir"
require "sidekiq"
require_relative "bench_job"

Redis.sadd_returns_boolean = false if Redis.respond_to?(:sadd_returns_boolean=)
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

opts = { host: "127.0.0.1", port: 6379, pid: nil, queues: 1, jobs: 20_000, concurrency: 10,
         max_seconds: 120.0 }
OptionParser.new do |o|
  o.on("--host H") { |v| opts[:host] = v }
  o.on("--port P", Integer) { |v| opts[:port] = v }
  o.on("--pid PID", Integer) { |v| opts[:pid] = v }
  o.on("--queues Q", Integer) { |v| opts[:queues] = v }
  o.on("--jobs N", Integer) { |v| opts[:jobs] = v }
  o.on("--concurrency C", Integer) { |v| opts[:concurrency] = v }
  o.on("--max-seconds S", Float) { |v| opts[:max_seconds] = v }
end.parse!
unless opts[:host] == "localhost" || opts[:host] == "::1" || opts[:host].start_with?("127.")
  abort "#{opts[:host]} is not a loopback address"
end

def cpu_seconds(pid)
  return nil unless pid
  s = File.read("/proc/#{pid}/stat")
  f = s[(s.rindex(")") + 2)..].split(" ")
  (f[11].to_i + f[12].to_i) / 100.0 # USER_HZ is 100 on Linux
rescue StandardError
  nil
end

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

url = "redis://#{opts[:host]}:#{opts[:port]}/0"
Sidekiq.configure_client { |c| c.redis = { url: url, size: 2 } }
Sidekiq.logger.level = Logger::WARN
run = "kb#{Process.pid}"
queues = (0...opts[:queues]).map { |i| "#{run}q#{i}" }
total = opts[:jobs] * queues.size

Sidekiq.redis { |r| queues.each { |q| r.del("queue:#{q}") } }
queues.each do |q|
  (0...opts[:jobs]).each_slice(1000) do |slice|
    Sidekiq::Client.push_bulk("class" => BenchJob, "queue" => q, "args" => slice.map { |i| [i] })
  end
end

log = File.join(Dir.tmpdir, "kite-bench-sidekiq-#{Process.pid}.log")
job_file = File.expand_path("bench_job.rb", __dir__)
pids = queues.map do |q|
  Process.spawn({ "REDIS_URL" => url }, "sidekiq", "-r", job_file, "-q", q,
                "-c", opts[:concurrency].to_s, "-t", "1", out: [log, "a"], err: [log, "a"])
end

redis = Redis.new(url: url)
left = lambda do
  redis.pipelined { |p| queues.each { |q| p.llen("queue:#{q}") } }.sum
end
deadline = now + opts[:max_seconds]
t0 = nil
cpu0 = nil
client0 = nil
remaining = total
loop do
  remaining = left.call
  if t0.nil? && remaining < total
    t0 = now
    cpu0 = cpu_seconds(opts[:pid])
    client0 = pids.sum { |p| cpu_seconds(p) || 0 }
  end
  break if remaining.zero? || now > deadline
  if pids.all? { |p| Process.waitpid(p, Process::WNOHANG) }
    warn "every sidekiq process exited early; log:\n#{File.read(log)[-4000..] || File.read(log)}"
    break
  end
  sleep 0.002
end
t1 = now
cpu1 = cpu_seconds(opts[:pid])
client1 = pids.sum { |p| cpu_seconds(p) || 0 }

pids.each do |p|
  Process.kill("TERM", p)
rescue Errno::ESRCH
  nil
end
pids.each do |p|
  Process.wait(p)
rescue Errno::ECHILD
  nil
end
Sidekiq.redis do |r|
  queues.each { |q| r.del("queue:#{q}") }
  r.srem("queues", queues)
end
File.delete(log) if File.exist?(log) && remaining.zero?

seconds = t0 ? t1 - t0 : 0.0
done = total - remaining
server_cpu = cpu0 && cpu1 ? cpu1 - cpu0 : nil
puts JSON.generate(
  workload: "sidekiq-drain", sidekiq: Sidekiq::VERSION, queues: queues.size, jobs_per_queue: opts[:jobs],
  concurrency: opts[:concurrency], operations: done, complete: remaining.zero?,
  seconds: seconds, ops_per_s: seconds.positive? ? done / seconds : nil,
  server_cpu_s: server_cpu,
  server_cpu_us_per_op: server_cpu && done.positive? ? server_cpu * 1e6 / done : nil,
  client_cpu_s: client0 ? client1 - client0 : nil,
  log: remaining.zero? ? nil : log
)
exit(remaining.zero? ? 0 : 1)
