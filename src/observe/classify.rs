//! Which keys belong to a job framework's layout, and to which of its queues.
//!
//! Names only: a key's value and a job's payload are never looked at. The table of
//! layouts is in docs/observe.md.

#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub enum Framework {
    None,
    Bull,
    BeeQueue,
    Sidekiq,
    Celery,
    Rq,
    Bullmq,
}

impl Framework {
    pub fn name(self) -> &'static str {
        match self {
            Framework::None => "none",
            Framework::Bull => "bull",
            Framework::Bullmq => "bullmq",
            Framework::BeeQueue => "bee-queue",
            Framework::Sidekiq => "sidekiq",
            Framework::Celery => "celery",
            Framework::Rq => "rq",
        }
    }
}

/// What a key is to its queue.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// The list jobs wait in: its pushes, pops and depth are the queue's.
    Waiting,
    /// A key workers block on without taking jobs from it (BullMQ's `marker`): counts
    /// consumers only.
    Consumer,
    /// Another key of a `<prefix>:<queue>` layout: says the queue exists.
    Other,
    /// A framework-wide key (Sidekiq's `schedule`, Celery's `unacked`): read when
    /// reported, not tracked.
    Global,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Class {
    pub framework: Framework,
    pub role: Role,
    /// The queue's name is `key[..row_len]`.
    pub row_len: usize,
    /// For `Other` and `Consumer` keys of a `<prefix>:<queue>` layout: the length of
    /// `<prefix>:<queue>`, whose waiting list is `<prefix>:<queue>:wait` (or `:waiting`).
    pub stem_len: usize,
}

/// Kombu names a queue's priority lists `<queue>\x06\x16<n>`.
const KOMBU_SEP: &[u8] = b"\x06\x16";

/// The suffix of a `<prefix>:<queue>` queue's waiting list.
pub fn waiting_suffix(framework: Framework) -> &'static [u8] {
    if framework == Framework::BeeQueue {
        b":waiting"
    } else {
        b":wait"
    }
}

/// Classifies `key` by name, `prefixes` being `queue-key-prefixes`. None: no layout.
pub fn classify(key: &[u8], prefixes: &[Vec<u8>]) -> Option<Class> {
    let first = *key.first()?;
    let whole = |framework, role| {
        Some(Class {
            framework,
            role,
            row_len: key.len(),
            stem_len: 0,
        })
    };
    // Cheap first-byte filters keep a key of no layout at a few comparisons.
    match first {
        b'q' if key.starts_with(b"queue:") && key.len() > 6 => {
            return whole(Framework::Sidekiq, Role::Waiting)
        }
        b'r' if key.starts_with(b"rq:queue:") && key.len() > 9 => {
            return whole(Framework::Rq, Role::Waiting)
        }
        b's' if key == b"schedule" => return whole(Framework::Sidekiq, Role::Global),
        b'r' if key == b"retry" => return whole(Framework::Sidekiq, Role::Global),
        b'd' if key == b"dead" => return whole(Framework::Sidekiq, Role::Global),
        b'u' if key == b"unacked" => return whole(Framework::Celery, Role::Global),
        b'c' if key == b"celery" => return whole(Framework::Celery, Role::Waiting),
        _ => {}
    }
    for p in prefixes {
        // The first byte before the length and the rest: most keys are of no layout.
        if p.first() == Some(&first)
            && key.len() > p.len() + 1
            && key.starts_with(p)
            && key[p.len()] == b':'
        {
            let Some(colon) = key.iter().rposition(|&b| b == b':') else {
                continue;
            };
            if colon <= p.len() {
                continue;
            }
            let suffix = &key[colon + 1..];
            let bee = p.as_slice() == b"bq";
            let (framework, role) = if bee {
                match suffix {
                    b"waiting" => (Framework::BeeQueue, Role::Waiting),
                    b"active" | b"succeeded" | b"failed" | b"delayed" | b"stalling"
                    | b"stallBlock" | b"id" => (Framework::BeeQueue, Role::Other),
                    _ => return None,
                }
            } else {
                match suffix {
                    b"wait" => (Framework::Bull, Role::Waiting),
                    b"marker" => (Framework::Bullmq, Role::Consumer),
                    b"prioritized" | b"events" | b"meta" | b"waiting-children" => {
                        (Framework::Bullmq, Role::Other)
                    }
                    b"paused" | b"active" | b"delayed" | b"completed" | b"failed" | b"priority"
                    | b"stalled" | b"id" => (Framework::Bull, Role::Other),
                    _ => return None,
                }
            };
            return Some(Class {
                framework,
                role,
                row_len: colon,
                stem_len: colon,
            });
        }
    }
    kombu_separator(key).map(|at| Class {
        framework: Framework::Celery,
        role: Role::Waiting,
        row_len: at,
        stem_len: 0,
    })
}

/// Where Kombu's priority separator first appears, when a queue name comes before it.
/// Every push to an untracked key of no layout, and every pop of one past the table's
/// cap, ends here: a byte search, not a compare of every pair of bytes (which was most
/// of such a call's cost).
fn kombu_separator(key: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = crate::types::key::find_byte(&key[from..], KOMBU_SEP[0]) {
        let at = from + i;
        if key.get(at + 1) == Some(&KOMBU_SEP[1]) {
            return (at > 0).then_some(at);
        }
        from = at + 1;
    }
    None
}

/// The keys whose lengths are a framework queue's jobs by state, for the queue named
/// `row`: (state, key).
pub fn state_keys(framework: Framework, row: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let with = |suffix: &str| {
        let mut k = row.to_vec();
        k.push(b':');
        k.extend_from_slice(suffix.as_bytes());
        k
    };
    let states: &[(&str, &str)] = match framework {
        Framework::Bullmq => &[
            ("waiting", "wait"),
            ("paused", "paused"),
            ("active", "active"),
            ("prioritized", "prioritized"),
            ("delayed", "delayed"),
            ("completed", "completed"),
            ("failed", "failed"),
            ("waiting-children", "waiting-children"),
        ],
        // Bull 3 has no prioritized or waiting-children keys: those read 0 there.
        Framework::Bull => &[
            ("waiting", "wait"),
            ("paused", "paused"),
            ("active", "active"),
            ("prioritized", "prioritized"),
            ("delayed", "delayed"),
            ("completed", "completed"),
            ("failed", "failed"),
            ("waiting-children", "waiting-children"),
        ],
        Framework::BeeQueue => &[
            ("waiting", "waiting"),
            ("active", "active"),
            ("delayed", "delayed"),
            ("completed", "succeeded"),
            ("failed", "failed"),
        ],
        Framework::Rq => {
            let name = &row[b"rq:queue:".len().min(row.len())..];
            let rq = |state: &'static str, registry: &str| {
                let mut k = format!("rq:{registry}:").into_bytes();
                k.extend_from_slice(name);
                (state, k)
            };
            return vec![
                ("waiting", row.to_vec()),
                rq("active", "wip"),
                rq("scheduled", "scheduled"),
                rq("deferred", "deferred"),
                rq("completed", "finished"),
                rq("failed", "failed"),
                rq("canceled", "canceled"),
            ];
        }
        Framework::Sidekiq | Framework::Celery => return vec![("waiting", row.to_vec())],
        Framework::None => return Vec::new(),
    };
    states.iter().map(|(s, suf)| (*s, with(suf))).collect()
}

/// Framework-wide states: (framework, state, key).
pub const GLOBAL_STATES: &[(Framework, &str, &[u8])] = &[
    (Framework::Sidekiq, "scheduled", b"schedule"),
    (Framework::Sidekiq, "retry", b"retry"),
    (Framework::Sidekiq, "dead", b"dead"),
    (Framework::Celery, "unacked", b"unacked"),
];

/// The key holding a framework-wide state.
pub fn global_key(framework: Framework, state: &str) -> &'static [u8] {
    GLOBAL_STATES
        .iter()
        .find(|(f, s, _)| *f == framework && *s == state)
        .map_or(b"", |(_, _, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixes() -> Vec<Vec<u8>> {
        vec![b"bull".to_vec(), b"bq".to_vec()]
    }

    #[test]
    fn layouts() {
        let p = prefixes();
        let c = classify(b"bull:emails:wait", &p).unwrap();
        assert_eq!(
            (c.framework, c.role, c.row_len),
            (Framework::Bull, Role::Waiting, 11)
        );
        let c = classify(b"bull:emails:marker", &p).unwrap();
        assert_eq!((c.framework, c.role), (Framework::Bullmq, Role::Consumer));
        assert_eq!(classify(b"bull:emails:42", &p), None);
        assert_eq!(classify(b"bull:emails:42:lock", &p), None);
        let c = classify(b"bq:mail:waiting", &p).unwrap();
        assert_eq!(
            (c.framework, c.role, c.row_len),
            (Framework::BeeQueue, Role::Waiting, 7)
        );
        let c = classify(b"queue:default", &p).unwrap();
        assert_eq!(
            (c.framework, c.role, c.row_len),
            (Framework::Sidekiq, Role::Waiting, 13)
        );
        assert_eq!(classify(b"schedule", &p).unwrap().role, Role::Global);
        let c = classify(b"tasks\x06\x163", &p).unwrap();
        assert_eq!((c.framework, c.row_len), (Framework::Celery, 5));
        assert_eq!(
            classify(b"rq:queue:default", &p).unwrap().framework,
            Framework::Rq
        );
        assert_eq!(classify(b"mylist", &p), None);
        // The separator's first place counts, after a lone \x06; at the start, no queue.
        for (key, row) in [
            (&b"a\x06\x16"[..], Some(1)),
            (b"\x06\x16x\x06\x16", None),
            (b"\x06\x06\x16", Some(1)),
            (b"ab\x06x\x06\x169", Some(4)),
            (b"ab\x06", None),
            (b"\x06\x16", None),
            (b"ab\x16\x06", None),
        ] {
            assert_eq!(classify(key, &p).map(|c| c.row_len), row, "{key:?}");
        }
        assert_eq!(classify(b"", &p), None);
    }

    #[test]
    fn state_key_names() {
        let k = state_keys(Framework::Rq, b"rq:queue:high");
        assert!(k.contains(&("completed", b"rq:finished:high".to_vec())));
        let k = state_keys(Framework::Bullmq, b"bull:emails");
        assert!(k.contains(&("delayed", b"bull:emails:delayed".to_vec())));
    }
}
