//! Cluster mode: Redis Cluster's slots, redirections, config file and binary bus, so
//! that `redis-cli --cluster`, cluster clients and Redis 7 nodes work with Kite nodes.
//! See docs/cluster.md.
//!
//! Owns the node's view of the cluster (`state`), the slot map the data path reads
//! (`view`), the bus (`wire`, `bus`) and `cluster-config-file` (`nodes_conf`). It never
//! touches a shard's data: counting and listing a slot's keys are messages to the
//! shards, and moving keys is MIGRATE's work.

pub mod bus;
pub mod failover;
pub mod nodes_conf;
pub mod redirect;
pub mod state;
pub mod view;
pub mod wire;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use crate::config::Config;

pub use crate::shard::placement::SLOTS;

pub fn now_ms() -> u64 {
    crate::shard::unix_ms()
}

/// The cluster side of a node in cluster mode (`Shared::cluster`).
pub struct Cluster {
    /// The control plane: the one lock cluster mode adds (docs/cluster.md says why it is
    /// off the data path).
    state: Mutex<state::State>,
    pub view: view::SlotView,
    pub conf_path: PathBuf,
    /// This node's client port and bus port.
    pub port: u16,
    pub cport: u16,
    /// Wakes the bus thread for work a command asked for (MEET, a config save).
    pub wake: tokio::sync::Notify,
    /// PUBLISH and SPUBLISH for the other nodes: (shard only, channel, message).
    publish_tx: tokio::sync::mpsc::UnboundedSender<Published>,
    pub publish_rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Published>>>,
}

pub type Published = (bool, bytes::Bytes, bytes::Bytes);

impl Cluster {
    /// Reads `cluster-config-file` (or starts a new node) when `cluster-enabled` is on.
    pub fn from_config(config: &Config) -> Result<Option<Cluster>, String> {
        if !config.get_bool("cluster-enabled") {
            return Ok(None);
        }
        let dir = PathBuf::from(config.get("dir"));
        let file = PathBuf::from(config.get("cluster-config-file"));
        let conf_path = if file.is_absolute() {
            file
        } else {
            dir.join(file)
        };
        let port = config.get_i64("port") as u16;
        let cport = match config.get_i64("cluster-port") as u16 {
            0 => port.checked_add(10000).ok_or_else(|| {
                format!("Redis port number too high. Cluster communication port is 10,000 port numbers higher than your Redis port. Your Redis port number must be 55535 or less, but {port} was specified.")
            })?,
            p => p,
        };
        let (mut st, fresh) = match nodes_conf::load(&conf_path)? {
            Some(st) => (st, false),
            None => (state::State::new(state::random_name()), true),
        };
        {
            let me = st.me_mut();
            me.port = port;
            me.cport = cport;
            me.pport = config.get_i64("tls-port") as u16;
        }
        let (publish_tx, publish_rx) = tokio::sync::mpsc::unbounded_channel();
        let cluster = Cluster {
            state: Mutex::new(st),
            view: Default::default(),
            conf_path,
            port,
            cport,
            wake: tokio::sync::Notify::new(),
            publish_tx,
            publish_rx: Mutex::new(Some(publish_rx)),
        };
        {
            let mut st = cluster.lock();
            cluster.apply_settings(&mut st, config);
            st.update_health();
            st.publish(&cluster.view);
            if fresh {
                tracing::info!(
                    "No cluster configuration found, I'm {}",
                    state::name_str(&st.myself)
                );
            } else {
                tracing::info!(
                    "Node configuration loaded, I'm {}",
                    state::name_str(&st.myself)
                );
            }
            cluster.save_now(&st)?;
        }
        Ok(Some(cluster))
    }

    /// Hands a message published here to the bus: every node hears a PUBLISH, the
    /// nodes of this node's shard an SPUBLISH.
    pub fn publish(&self, shard: bool, channel: bytes::Bytes, message: bytes::Bytes) {
        let _ = self.publish_tx.send((shard, channel, message));
    }

    pub fn lock(&self) -> MutexGuard<'_, state::State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Settings that CONFIG SET may change, read into the state.
    pub fn apply_settings(&self, st: &mut state::State, config: &Config) {
        st.node_timeout = config.get_i64("cluster-node-timeout").max(1) as u64;
        st.require_full_coverage = config.get_bool("cluster-require-full-coverage");
        st.allow_reads_when_down = config.get_bool("cluster-allow-reads-when-down");
        st.replica_no_failover = config.get_bool("cluster-replica-no-failover");
        st.allow_replica_migration = config.get_bool("cluster-allow-replica-migration");
        st.replica_validity_factor = config.get_i64("cluster-replica-validity-factor") as u64;
        let me = st.me_mut();
        me.hostname = config.get("cluster-announce-hostname").to_string();
        me.human_name = config.get("cluster-announce-human-nodename").to_string();
        let ip = config.get("cluster-announce-ip");
        if !ip.is_empty() {
            me.ip = ip.to_string();
        }
        let (ap, abp) = (
            config.get_i64("cluster-announce-port") as u16,
            config.get_i64("cluster-announce-bus-port") as u16,
        );
        me.port = if ap != 0 { ap } else { self.port };
        me.cport = if abp != 0 { abp } else { self.cport };
    }

    /// Writes the config file now; an error here is what Redis treats as fatal at
    /// start-up and logs later.
    pub fn save_now(&self, st: &state::State) -> Result<(), String> {
        nodes_conf::save(&self.conf_path, &nodes_conf::render(st)).map_err(|e| {
            format!(
                "Could not save the cluster configuration file {}: {e}",
                self.conf_path.display()
            )
        })
    }

    /// After a change: recompute health, publish the view, and save when asked.
    pub fn commit(&self, st: &mut state::State, save: bool) -> Result<(), String> {
        st.update_health();
        st.publish(&self.view);
        if save {
            st.save_pending = false;
            self.save_now(st)?;
        }
        Ok(())
    }
}
