//! The model's network: messages delivered after a delay, in delivery-time order (ties in
//! sending order), possibly late (a call that timed out on its sender and was applied
//! anyway) or twice (a call sent again).

/// Messages in flight.
#[derive(Debug)]
pub(crate) struct Net<T> {
    in_flight: Vec<(u64, u64, T)>,
    sent: u64,
}

impl<T> Default for Net<T> {
    fn default() -> Self {
        Self { in_flight: Vec::new(), sent: 0 }
    }
}

impl<T> Net<T> {
    /// Send `message`, delivered at `at_ms`.
    pub(crate) fn send(&mut self, at_ms: u64, message: T) {
        self.sent += 1;
        self.in_flight.push((at_ms, self.sent, message));
    }

    /// The messages due at `now_ms`, taken out, in delivery order.
    pub(crate) fn due(&mut self, now_ms: u64) -> Vec<T> {
        if !self.in_flight.iter().any(|(at, _, _)| *at <= now_ms) {
            return Vec::new();
        }
        let (mut due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.in_flight).into_iter().partition(|(at, _, _)| *at <= now_ms);
        self.in_flight = later;
        due.sort_by_key(|(at, seq, _)| (*at, *seq));
        due.into_iter().map(|(_, _, message)| message).collect()
    }

    /// Messages in flight.
    pub(crate) fn len(&self) -> usize {
        self.in_flight.len()
    }
}
