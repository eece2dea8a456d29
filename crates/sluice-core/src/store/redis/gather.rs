//! The requests waiting at one moment for one server share one script call: the task that gathers them, and the
//! handle that queues a request's calls for it. Against one server (standalone, Sentinel) there is one such task; in
//! a cluster each primary has its own, whose calls carry descriptors of any of its slots ([`Form::Node`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fred::clients::{Client, Pool};
use fred::error::{Error as FredError, ErrorKind};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use super::call::{Call, Form, eval};
use super::reply::Reply;
use super::script::DecisionScript;

/// The most descriptors one shared script call decides (a request with more goes alone): it bounds how long one call
/// holds Redis, where each descriptor costs a few microseconds.
pub(super) const MAX_BATCH: usize = 64;

/// The queue of one gathering task: where a request's calls wait to be taken into a script call.
#[derive(Clone)]
pub(super) struct Batches {
    queue: mpsc::UnboundedSender<Job>,
    /// Requests queued and not yet taken into a script call, shared by every task of a store.
    waiting: Arc<AtomicUsize>,
}

impl Batches {
    /// Starts the task that gathers the requests for the server `pool` reaches into script calls in `form`, and
    /// returns its queue. The task ends once every handle to the queue is dropped.
    pub(super) fn start(
        pool: Pool,
        script: Arc<DecisionScript>,
        timeout: Duration,
        form: Form,
        waiting: Arc<AtomicUsize>,
    ) -> Batches {
        let (queue, jobs) = mpsc::unbounded_channel();
        tokio::spawn(gather(pool, script, timeout, form, jobs, waiting.clone()));
        Batches { queue, waiting }
    }

    /// Queues one request's `calls` and waits for their answers, one per call, in order. The calls go out whether or
    /// not this future is still awaited (a request dropped meanwhile is decided all the same, its answer unread); a
    /// request that waits longer than the store's timeout to be taken fails without going out.
    pub(super) async fn send(&self, calls: Vec<Call>) -> Result<Vec<Reply>, FredError> {
        let (reply, answer) = oneshot::channel();
        let gone = || FredError::new(ErrorKind::Canceled, "the redis store is shutting down");
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let job = Job {
            calls,
            queued: Instant::now(),
            reply,
        };
        if self.queue.send(job).is_err() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(gone());
        }
        answer.await.unwrap_or_else(|_| Err(gone()))
    }
}

/// One request's calls, waiting to be gathered into a script call, and where their answers go.
struct Job {
    calls: Vec<Call>,
    /// When it was queued: a request that waited longer than the store's timeout fails instead of going out.
    queued: Instant,
    reply: oneshot::Sender<Result<Vec<Reply>, FredError>>,
}

/// The task that gathers waiting requests into script calls of at most [`MAX_BATCH`] descriptors each, with as many
/// calls in flight as the pool has connections (at least two, so that Redis works on one while the answer to the
/// other travels). It never waits for more requests to come: while a call is free, a request that finds nothing else
/// waiting goes out alone at once; under load, the requests that arrive while every call is in flight go out
/// together in the next. Bounding the calls in flight is what makes the batches grow whichever scheduler runs the
/// task (on a multi-threaded runtime, an idle worker would otherwise take each request out alone). A request that
/// waited for a call longer than the store's timeout fails with a timeout instead of going out; as every call is
/// bounded by the timeout too, an unanswering Redis fails any request within three times the timeout.
///
/// The task drives its calls in flight itself rather than spawning a task per call: a spawn per call, and the hop
/// from that task back to this one, cost more than anything else between a request and its EVALSHA. Once its queue
/// is closed, the task ends when its calls in flight have answered.
async fn gather(
    pool: Pool,
    script: Arc<DecisionScript>,
    timeout: Duration,
    form: Form,
    mut queue: mpsc::UnboundedReceiver<Job>,
    waiting: Arc<AtomicUsize>,
) {
    let flights = pool.size().max(2);
    let mut in_flight = FuturesUnordered::new();
    let mut next: Option<Job> = None;
    loop {
        // A call is free and a request waits, or one comes: take it and whatever waits behind it into a call.
        let first = tokio::select! {
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => continue,
            job = async {
                match next.take() {
                    Some(job) => Some(job),
                    None => queue.recv().await.map(|job| taken(&waiting, job)),
                }
            }, if in_flight.len() < flights => match job {
                Some(job) => job,
                None => break,
            },
        };
        let mut batch = Vec::new();
        let mut descriptors = 0;
        let mut job = Some(first);
        while descriptors < MAX_BATCH {
            let job = match job.take() {
                Some(job) => job,
                None => match queue.try_recv() {
                    Ok(job) => taken(&waiting, job),
                    Err(_) => break,
                },
            };
            if job.queued.elapsed() > timeout {
                let _ = job.reply.send(Err(FredError::new(
                    ErrorKind::Timeout,
                    "no script call came free within the store's timeout",
                )));
                continue;
            }
            if !batch.is_empty() && descriptors + job.calls.len() > MAX_BATCH {
                next = Some(job);
                break;
            }
            descriptors += job.calls.len();
            batch.push(job);
        }
        if !batch.is_empty() {
            in_flight.push(call(pool.next().clone(), &script, form, batch));
        }
    }
    while in_flight.next().await.is_some() {}
}

/// One script call deciding `batch`, each request answered with its calls' answers.
async fn call(client: Client, script: &DecisionScript, form: Form, batch: Vec<Job>) {
    let mut calls = Vec::with_capacity(batch.len());
    let mut replies = Vec::with_capacity(batch.len());
    for job in batch {
        replies.push((job.reply, job.calls.len()));
        calls.extend(job.calls);
    }
    match eval(&client, script, calls, form, false).await {
        Ok(values) => {
            let mut values = values.into_iter();
            for (reply, n) in replies {
                let _ = reply.send(Ok(values.by_ref().take(n).collect()));
            }
        }
        Err(e) => {
            for (reply, _) in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// A job just taken off the queue: one fewer waiting.
fn taken(waiting: &AtomicUsize, job: Job) -> Job {
    waiting.fetch_sub(1, Ordering::Relaxed);
    job
}
