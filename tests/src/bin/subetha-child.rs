//! `subetha-child`: an instrumented process for multi-process tests. Reads
//! commands on stdin and answers on stdout; the protocol is documented in
//! `subetha_tests::child`. It links subetha-core like any application, so
//! its symbol table is also where the hook symbols are checked.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use subetha_core::{Instance, InstanceKind, process_segment, process_sidecar};

const KIND: InstanceKind = InstanceKind {
    code: 200,
    name: "testkind",
    ops: &["one", "two", "three"],
};

/// Work sent to an observing thread.
struct Observe {
    instance: Arc<Instance>,
    n: u64,
    op: u16,
    flags: u16,
    latency: u64,
}

struct Worker {
    work: Sender<Observe>,
    done: Receiver<[u64; 3]>,
    handle: JoinHandle<()>,
}

fn observe(job: Observe) -> [u64; 3] {
    let mut counts = [0u64; 3];
    for _ in 0..job.n {
        match job.instance.observe(job.op, job.flags, job.latency) {
            Ok(true) => counts[0] += 1,
            Ok(false) => counts[1] += 1,
            Err(_) => counts[2] += 1,
        }
    }
    counts
}

fn main() {
    let mut instances: HashMap<String, Arc<Instance>> = HashMap::new();
    let mut workers: HashMap<String, Worker> = HashMap::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        let reply = run(&words, &mut instances, &mut workers);
        let quit = words.first() == Some(&"quit");
        let text = match reply {
            Ok(text) if text.is_empty() => "ok".to_owned(),
            Ok(text) => format!("ok {text}"),
            Err(error) => format!("err {error}"),
        };
        if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() || quit {
            break;
        }
    }
}

fn run(
    words: &[&str],
    instances: &mut HashMap<String, Arc<Instance>>,
    workers: &mut HashMap<String, Worker>,
) -> Result<String, String> {
    let arg = |i: usize| {
        words
            .get(i)
            .copied()
            .ok_or_else(|| format!("missing argument {i}"))
    };
    let num = |i: usize| -> Result<u64, String> { arg(i)?.parse().map_err(|e| format!("argument {i}: {e}")) };
    match words.first().copied().unwrap_or("") {
        "info" => {
            let segment = process_segment().map_err(|e| e.to_string())?;
            let fd = segment.fd().map_or(-1, |fd| fd.as_raw_fd());
            let view = segment.view();
            Ok(format!(
                "{} {fd} {} {} {}",
                view.layout().pid,
                view.base_addr(),
                view.layout().ring_slot_capacity,
                u8::from(process_sidecar().is_some())
            ))
        }
        "register" => {
            let name = arg(1)?;
            let instance = Instance::register(KIND, name).map_err(|e| e.to_string())?;
            let id = instance.id();
            instances.insert(name.to_owned(), Arc::new(instance));
            Ok(id.to_string())
        }
        "drop" => {
            let instance = instances.remove(arg(1)?).ok_or("no such instance")?;
            Arc::try_unwrap(instance).map_err(|_| "instance still in use")?;
            Ok(String::new())
        }
        "spawn" => {
            let name = arg(1)?.to_owned();
            let (work_tx, work_rx) = channel::<Observe>();
            let (done_tx, done_rx) = channel();
            let (ids_tx, ids_rx) = channel();
            let handle = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::gettid() } as u32;
                    let _ = ids_tx.send((tid, subetha_core::thread_id()));
                    for job in work_rx {
                        let counts = observe(job);
                        if done_tx.send(counts).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| e.to_string())?;
            let (tid, id) = ids_rx.recv().map_err(|e| e.to_string())?;
            workers.insert(
                name,
                Worker {
                    work: work_tx,
                    done: done_rx,
                    handle,
                },
            );
            Ok(format!("{tid} {id}"))
        }
        "observe" => {
            let instance = Arc::clone(instances.get(arg(2)?).ok_or("no such instance")?);
            let job = Observe {
                instance,
                n: num(3)?,
                op: num(4)? as u16,
                flags: num(5)? as u16,
                latency: num(6)?,
            };
            let counts = if arg(1)? == "main" {
                observe(job)
            } else {
                let worker = workers.get(arg(1)?).ok_or("no such thread")?;
                worker.work.send(job).map_err(|e| e.to_string())?;
                worker.done.recv().map_err(|e| e.to_string())?
            };
            Ok(format!("{} {} {}", counts[0], counts[1], counts[2]))
        }
        "join" => {
            let worker = workers.remove(arg(1)?).ok_or("no such thread")?;
            drop(worker.work);
            worker.handle.join().map_err(|_| "thread panicked")?;
            Ok(String::new())
        }
        "quit" => Ok(String::new()),
        other => Err(format!("unknown command {other:?}")),
    }
}
