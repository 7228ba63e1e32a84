# The job and the fetch strategy of the Sidekiq kill -9 check (kill9.rb), loaded by each of
# its `sidekiq -r` processes.
#
# Sidekiq's own fetch (BRPOP) takes a job off the queue for good: a job in flight when the
# server dies, or whose BRPOP reply the dying server never sent, is gone on Redis too. So
# a check that an acknowledged job is never lost could not tell the server's losses from
# Sidekiq's. The processes here fetch the way Sidekiq Pro's reliable fetch does, through
# Sidekiq's documented fetch hook: BLMOVE from the queue to a list of this process's jobs
# in progress (k9:processing:<pid>), LREM from it once the job is acknowledged. Every job
# is then always somewhere: its queue, that list, the schedule or retry set, or done.
require "sidekiq"

Redis.sadd_returns_boolean = false if Redis.respond_to?(:sadd_returns_boolean=)
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

module Kill9
  QUEUE = "queue:default"
  PROCESSING = "k9:processing:" # + pid
  DONE = "k9:done" # a set of jids
  ATTEMPTS = "k9:attempts" # jid -> attempts of the flaky jobs

  # Each process appends the jid of every job whose completion the server acknowledged
  # (SADD to k9:done returned) to KILL9_LOG_DIR/done-<pid>.log, and of every job it put
  # back on the queue (shutdown) to requeued-<pid>.log; the check reads them back.
  def self.log(what, jid)
    dir = ENV["KILL9_LOG_DIR"] or return
    File.open(File.join(dir, "#{what}-#{::Process.pid}.log"), "a") { |f| f.write("#{jid}\n") }
  end
end

class Kill9Fetch
  TIMEOUT = 2 # seconds a fetch blocks, so that a processor notices a shutdown

  UnitOfWork = Struct.new(:queue, :job, :processing, :config) do
    def acknowledge
      Sidekiq.redis { |c| c.lrem(processing, -1, job) }
    end

    def queue_name
      queue.delete_prefix("queue:")
    end

    # Back to the end of the queue that BLMOVE takes from (as BasicFetch does), and off
    # the in-progress list, at once.
    def requeue
      Kill9.log("requeued", Sidekiq.load_json(job)["jid"])
      Sidekiq.redis do |c|
        c.multi do |m|
          m.rpush(queue, job)
          m.lrem(processing, -1, job)
        end
      end
    end
  end

  # Sidekiq 6 passes its options, Sidekiq 7 a capsule; the check uses one queue.
  def initialize(*)
    @processing = "#{Kill9::PROCESSING}#{::Process.pid}"
  end

  def retrieve_work
    job = Sidekiq.redis { |c| c.blmove(Kill9::QUEUE, @processing, "RIGHT", "LEFT", timeout: TIMEOUT) }
    UnitOfWork.new(Kill9::QUEUE, job, @processing, nil) if job
  end

  # At shutdown, the jobs still running go back to the queue.
  def bulk_requeue(inprogress, _options = nil)
    inprogress.each(&:requeue)
  rescue StandardError => e
    Sidekiq.logger.warn("kill9: failed to requeue #{inprogress.size} jobs: #{e.message}")
  end
end

Sidekiq.configure_server do |config|
  if config.respond_to?(:options) # Sidekiq 6
    config.options[:fetch] = Kill9Fetch.new(config.options)
    config.options[:poll_interval_average] = 1
  else # Sidekiq 7
    config[:fetch_class] = Kill9Fetch
    config[:average_scheduled_poll_interval] = 1
  end
end

# Records its jid in k9:done. Jobs pushed with flaky = true fail their first attempt and
# come back through the retry set (Sidekiq adds up to 9 s of jitter to the 2 s; kill9.rb
# retries them by hand once its checks are done).
class Kill9Job
  include Sidekiq::Worker
  sidekiq_options retry: 25
  sidekiq_retry_in { |_count, _exc| 2 }

  def perform(_n, flaky)
    if flaky && Sidekiq.redis { |r| r.hincrby(Kill9::ATTEMPTS, jid, 1) } == 1
      raise "flaky #{jid}: first attempt fails"
    end

    sleep 0.01 # some work, so that jobs are in flight when the server dies
    Sidekiq.redis { |r| r.sadd(Kill9::DONE, jid) }
    Kill9.log("done", jid)
  end
end
