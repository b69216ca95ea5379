//! Tests of the refresher state machine, with paused time.
