//! `courier serve`: the web console ([`courier_cli::console`]) over the broker and store
//! the command line connected to (the store's workflow history too), until Ctrl-C.
//!
//! An embedded broker's file is served as an [`EmbeddedFile`]: the broker the command
//! opened (to release the locks a previous process left, as every command does) is
//! closed before the console serves, which then reads the file without its lock and opens
//! it only for each change; the application can start meanwhile, and the console is
//! read-only while it runs.

use std::path::Path;
use std::sync::Arc;

use courier::admin::QueueAdmin;
use courier_cli::console::{Console, ConsoleError, DEFAULT_SAMPLE_EVERY, EmbeddedFile};

use crate::Exit;
use crate::args::ServeArgs;
use crate::commands::Connections;

/// Serves the console; the exit code says how it ended. `embedded` is the broker file
/// given with `--embedded`.
pub(crate) async fn serve(args: &ServeArgs, to: &Connections, embedded: Option<&Path>) -> Exit {
    let mut console = Console::new().sample_every(args.sample_every.to_std().unwrap_or(DEFAULT_SAMPLE_EVERY));
    let mut file = None;
    let mut queues = to.queues.clone();
    let mut store = to.store.clone();
    let mut history = to.history.clone();
    if let (Some(path), Some(opened)) = (embedded, &to.embedded) {
        // The file is the store too unless --postgres or --sqlite named another.
        let store_too = store
            .as_ref()
            .is_some_and(|s| s.describe() == QueueAdmin::describe(opened));
        opened.close().await;
        let served = match EmbeddedFile::open(path).await {
            Ok(f) => Arc::new(f),
            Err(e) => {
                crate::report(&e);
                return crate::code_of(&e);
            }
        };
        queues = Some(served.clone());
        if store_too {
            store = Some(served.clone());
            history = Some(served.clone());
        }
        let probe = served.clone();
        console = console.read_only_when(move || probe.read_only_reason());
        file = Some(served);
    }
    if let Some(queues) = queues {
        console = console.queues(queues);
    }
    if let Some(store) = store {
        console = console.store(store);
    }
    if let Some(history) = history {
        console = console.history(history);
    }
    if let Some(token) = &args.token {
        console = console.token(token.clone());
    }
    if let Err(e) = console.check_listen(args.listen) {
        say!("error: {e}");
        return Exit::Usage;
    }
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            say!(
                "error: cannot listen on {}: {e} (another process may use it: choose another with --listen)",
                args.listen
            );
            return Exit::Unavailable;
        }
    };
    let shown = listener.local_addr().unwrap_or(args.listen);
    say!(
        "courier console on http://{shown}/ ({}); Ctrl-C stops it",
        if args.token.is_some() {
            "access token required"
        } else {
            "loopback only, no token"
        }
    );
    if let Some(f) = &file {
        say!(
            "the broker file {} is not held: the application can start while the console serves (the console opens \
             the file only for each change, and is read-only while the application runs){}",
            f.path().display(),
            if f.read_only_reason().is_some() {
                "; the application runs now: read-only"
            } else {
                ""
            }
        );
    }
    let stop = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            say!("error: cannot listen for Ctrl-C ({e}); stop the console with SIGTERM");
            std::future::pending::<()>().await;
        }
    };
    match console.serve(listener, stop).await {
        Ok(()) => {
            say!("courier console stopped");
            Exit::Ok
        }
        Err(e @ (ConsoleError::TokenRequired { .. } | ConsoleError::WeakToken { .. })) => {
            say!("error: {e}");
            Exit::Usage
        }
        Err(e) => {
            say!("error: {e}");
            Exit::Failed
        }
    }
}
