# Jobs for the Sidekiq suite, loaded both by the suite (to push them) and by each
# `sidekiq -r` process (to run them). Every execution is recorded in Redis under kt:*
# keys, so the suite checks what ran, how often, where and when.
require "socket"
require "sidekiq"

Redis.sadd_returns_boolean = false if Redis.respond_to?(:sadd_returns_boolean=)
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

# TLS for a rediss:// URL (tests/frameworks/secure/run.sh): redis-rb's ssl_params from the
# PEM files named by KITE_TLS_CA (the CA that signed the server's certificate),
# KITE_TLS_CERT and KITE_TLS_KEY (the client's certificate and key), each when set. A user
# and password in the URL (rediss://user:pass@host:port) make redis-rb send AUTH user pass.
# Any other URL: nil, and nothing changes.
module KiteTLS
  def self.ssl_params(url)
    return nil unless url.to_s.start_with?("rediss://")

    require "openssl"
    params = {}
    params[:ca_file] = ENV["KITE_TLS_CA"] if ENV["KITE_TLS_CA"]
    params[:cert] = OpenSSL::X509::Certificate.new(File.read(ENV["KITE_TLS_CERT"])) if ENV["KITE_TLS_CERT"]
    params[:key] = OpenSSL::PKey.read(File.read(ENV["KITE_TLS_KEY"])) if ENV["KITE_TLS_KEY"]
    params
  end
end

Sidekiq.configure_server do |config|
  # Sidekiq finds REDIS_URL itself; a rediss:// one also needs the TLS files.
  if (ssl = KiteTLS.ssl_params(ENV["REDIS_URL"]))
    config.redis = { url: ENV["REDIS_URL"], ssl_params: ssl }
  end
  # Poll the scheduled and retry sets about once a second. Sidekiq 6 reads
  # poll_interval_average (set, it also skips the 10 s start-up wait); 7 reads
  # average_scheduled_poll_interval.
  opts = config.respond_to?(:options) ? config.options : config
  opts[:poll_interval_average] = 1
  opts[:average_scheduled_poll_interval] = 1
end

module KiteRecord
  # Counts one execution of job `id` of group `set`, and notes which process ran it
  # and when.
  def record(set, id)
    Sidekiq.redis do |r|
      r.hincrby("kt:exec:#{set}", id.to_s, 1)
      r.hset("kt:pid:#{set}", id.to_s, ::Process.pid.to_s)
      r.hset("kt:at:#{set}", id.to_s, Time.now.to_f.to_s)
    end
  end

  def attempt(set, id)
    Sidekiq.redis { |r| r.hincrby("kt:att:#{set}", id.to_s, 1) }
  end
end

# Succeeds at once (after a few milliseconds, so that every process gets a share).
class CountJob
  include Sidekiq::Worker
  include KiteRecord
  sidekiq_options retry: false

  def perform(set, id)
    sleep 0.005
    record(set, id)
  end
end

# Fails its first attempt, succeeds on the retry that the retry poller brings back.
class FlakyJob
  include Sidekiq::Worker
  include KiteRecord
  sidekiq_options retry: 3
  sidekiq_retry_in { |_count, _exc| 1 }

  def perform(id)
    n = attempt("flaky", id)
    raise "flaky #{id} attempt #{n}" if n == 1

    record("flaky", id)
  end
end

# Always fails: one retry, then the dead set.
class DeadJob
  include Sidekiq::Worker
  include KiteRecord
  sidekiq_options retry: 1
  sidekiq_retry_in { |_count, _exc| 1 }

  def perform(id)
    n = attempt("dead", id)
    raise "dead #{id} attempt #{n}"
  end
end

# Fails once and waits an hour in the retry set, until the suite retries it by hand.
class ParkedRetryJob
  include Sidekiq::Worker
  include KiteRecord
  sidekiq_options retry: 5
  sidekiq_retry_in { |_count, _exc| 3600 }

  def perform(id)
    n = attempt("parked", id)
    raise "parked #{id} attempt #{n}" if n == 1

    record("parked", id)
  end
end
