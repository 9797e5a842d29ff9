//! `courier serve`: the web console ([`courier_cli::console`]) over the broker and store
//! the command line connected to, until Ctrl-C.

use courier_cli::console::{Console, ConsoleError, DEFAULT_SAMPLE_EVERY};

use crate::Exit;
use crate::args::ServeArgs;
use crate::commands::Connections;

/// Serves the console; the exit code says how it ended.
pub(crate) async fn serve(args: &ServeArgs, to: &Connections) -> Exit {
    let mut console = Console::new().sample_every(args.sample_every.to_std().unwrap_or(DEFAULT_SAMPLE_EVERY));
    if let Some(queues) = &to.queues {
        console = console.queues(queues.clone());
    }
    if let Some(store) = &to.store {
        console = console.store(store.clone());
    }
    if let Some(token) = &args.token {
        console = console.token(token.clone());
    }
    if let Err(e) = console.check_listen(args.listen) {
        eprintln!("error: {e}");
        return Exit::Usage;
    }
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "error: cannot listen on {}: {e} (another process may use it: choose another with --listen)",
                args.listen
            );
            return Exit::Unavailable;
        }
    };
    let shown = listener.local_addr().unwrap_or(args.listen);
    eprintln!(
        "courier console on http://{shown}/ ({}); Ctrl-C stops it",
        if args.token.is_some() {
            "access token required"
        } else {
            "loopback only, no token"
        }
    );
    let stop = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            eprintln!("error: cannot listen for Ctrl-C ({e}); stop the console with SIGTERM");
            std::future::pending::<()>().await;
        }
    };
    match console.serve(listener, stop).await {
        Ok(()) => {
            eprintln!("courier console stopped");
            Exit::Ok
        }
        Err(e @ (ConsoleError::TokenRequired { .. } | ConsoleError::WeakToken { .. })) => {
            eprintln!("error: {e}");
            Exit::Usage
        }
        Err(e) => {
            eprintln!("error: {e}");
            Exit::Failed
        }
    }
}
