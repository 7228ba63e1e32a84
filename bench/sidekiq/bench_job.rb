# The no-op job the benchmark's sidekiq processes run (loaded with `sidekiq -r`).
require "sidekiq"

class BenchJob
  include Sidekiq::Worker
  sidekiq_options retry: false

  def perform(_n); end
end
