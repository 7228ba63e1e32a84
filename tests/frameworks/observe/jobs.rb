# Jobs for the observe suite's Sidekiq workload, loaded by sidekiq.rb (to push them) and by
# the `sidekiq -r` process (to run them). Each run is counted in the hash kt-obs:exec.
require "sidekiq"

Redis.sadd_returns_boolean = false if Redis.respond_to?(:sadd_returns_boolean=)
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

class ObsJob
  include Sidekiq::Worker
  sidekiq_options retry: false

  def perform(queue, id)
    Sidekiq.redis { |r| r.hincrby("kt-obs:exec", "#{queue}:#{id}", 1) }
  end
end
