//! The fixed-rate schedule, and its clock: a thread that releases requests at their scheduled times.
//!
//! Tokio's timer fires on whole milliseconds. Slots that each slept until their own request's time woke together
//! on every tick and sent that millisecond's requests as one burst (20 at once at 20 000/s); the server then answered
//! the last of a burst only after all the others, so the latency measured was the burst's, not the rate's. The pacer
//! sleeps on the operating system's clock instead, which wakes it within tens of microseconds, and releases the
//! requests one by one, in order, as each falls due; a waiting slot takes the next one and sends it at once. When
//! every slot is busy, released requests wait for a slot and their latency, counted from the schedule, shows it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The fixed-rate schedule: request `j` is due at `start + j / rate`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    pub rate: f64,
    /// The first request due at or after `measure_from`.
    pub first_measured: u64,
    /// The first request due at or after `deadline`: the schedule's end.
    pub end: u64,
}

impl Schedule {
    pub fn new(rate: f64, warmup: Duration, duration: Duration) -> Schedule {
        let index_at = |d: Duration| (d.as_secs_f64() * rate).ceil() as u64;
        Schedule {
            rate,
            first_measured: index_at(warmup),
            end: index_at(warmup + duration),
        }
    }

    /// How many requests are due in the measured window.
    pub fn measured(&self) -> u64 {
        self.end - self.first_measured
    }

    /// When request `index` is due, from the schedule's start.
    pub fn offset(&self, index: u64) -> Duration {
        Duration::from_secs_f64(index as f64 / self.rate)
    }
}

/// The longest the pacer's thread sleeps at once, so that it notices a stopped run.
const LONGEST_SLEEP: Duration = Duration::from_millis(100);

/// Releases the schedule's requests at their times; slots take them with [`Pacer::take`].
#[derive(Debug)]
pub(super) struct Pacer {
    schedule: Schedule,
    start: Instant,
    /// One permit per request released and not yet taken.
    released: Arc<Semaphore>,
    /// The index of the next request a slot takes.
    next: AtomicU64,
    /// Set when the run is over (the pacer is dropped): the thread stops.
    stop: Arc<AtomicBool>,
}

impl Pacer {
    /// Starts releasing the requests of `schedule`, timed from `start`. After the last one it releases `slots` more,
    /// so that every waiting slot wakes and learns the schedule is over.
    pub fn start(schedule: Schedule, start: Instant, slots: u64) -> std::io::Result<Pacer> {
        let released = Arc::new(Semaphore::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (permits, stopped) = (released.clone(), stop.clone());
        let origin = start.into_std();
        std::thread::Builder::new().name("bench-pacer".into()).spawn(move || {
            let mut due_index = 0;
            while due_index < schedule.end && !stopped.load(Ordering::Relaxed) {
                let due = origin + schedule.offset(due_index);
                let now = std::time::Instant::now();
                if due > now {
                    std::thread::sleep((due - now).min(LONGEST_SLEEP));
                    continue;
                }
                // Everything due by now, at least the request whose time it is.
                let mut upto = due_index + 1;
                while upto < schedule.end && origin + schedule.offset(upto) <= now {
                    upto += 1;
                }
                permits.add_permits((upto - due_index) as usize);
                due_index = upto;
            }
            permits.add_permits(slots as usize);
        })?;
        Ok(Pacer {
            schedule,
            start,
            released,
            next: AtomicU64::new(0),
            stop,
        })
    }

    /// The schedule it keeps.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Waits for the next released request; its index and scheduled time, or `None` once the schedule is over.
    pub async fn take(&self) -> Option<(u64, Instant)> {
        self.released.acquire().await.ok()?.forget();
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        (index < self.schedule.end).then(|| (index, self.start + self.schedule.offset(index)))
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_are_released_in_order_and_not_before_their_time() {
        let schedule = Schedule::new(2_000.0, Duration::ZERO, Duration::from_millis(50));
        let start = Instant::now();
        let pacer = Pacer::start(schedule, start, 3).unwrap();
        let mut taken = Vec::new();
        while let Some((index, due)) = pacer.take().await {
            assert!(Instant::now() >= due, "request {index} released before its time");
            assert_eq!(due, start + Duration::from_micros(500 * index));
            taken.push(index);
        }
        assert_eq!(taken, (0..100).collect::<Vec<_>>());
        // The schedule is over for every other slot too.
        assert_eq!(pacer.take().await, None);
        assert_eq!(pacer.take().await, None);
    }

    #[test]
    fn schedule_counts_the_measured_window() {
        let s = Schedule::new(1000.0, Duration::from_millis(500), Duration::from_secs(2));
        assert_eq!((s.first_measured, s.end, s.measured()), (500, 2500, 2000));
        assert_eq!(s.offset(1500), Duration::from_millis(1500));
    }
}
