//! KITE: Kite's own commands, not Redis's. `KITE QUEUES` and `KITE QUEUE` report the
//! queues Kite tracks (docs/observe.md, `crate::observe`).

use crate::async_handler;
use crate::observe::report::{self, find_row, gather, matches_pattern, write_row, KITE_HELP};

async_handler!(kite, |sess, args| {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    match sub.as_str() {
        "help" => super::server::help(sess, KITE_HELP),
        "queues" => {
            if args.len() > 3 {
                return sess.out.error(super::util::SYNTAX_ERR);
            }
            let snap = gather(&sess.worker, false).await;
            let rows: Vec<_> = snap
                .rows
                .iter()
                .filter(|r| matches_pattern(args.get(2), &r.name))
                .collect();
            sess.out.array(rows.len());
            for r in rows {
                write_row(&mut sess.out, r, snap.now_ms, None);
            }
        }
        "queue" => {
            let snap = gather(&sess.worker, true).await;
            match find_row(&snap, &args[2]) {
                None => sess.out.null(),
                Some(r) => {
                    let newest = report::newest(&sess.worker, r.db, r.key.clone(), 10, 256).await;
                    write_row(&mut sess.out, r, snap.now_ms, Some(&newest));
                }
            }
        }
        // The table's subcommand check has refused anything else.
        _ => sess.out.error("ERR unknown subcommand. Try KITE HELP."),
    }
});
