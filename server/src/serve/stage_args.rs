//! The staging-slot arguments of `serve` (README, "Staging slots").

use crate::slots::SlotConfig;
use clap::Args;
use std::time::Duration;

/// The most slots a pool, the control plane, or one address may have, and
/// the most pools: with the defaults the lease table holds at most 512
/// leases; at these bounds, 256 x 1,024.
const MAX_SLOTS: i64 = 1024;
const MAX_POOLS: i64 = 256;

/// How many nodes stage an update at once (per replica: each server
/// replica hands out its own slots).
#[derive(Debug, Args)]
pub struct StageArgs {
    /// Staging slots per pool: nodes of one pool holding a lease from
    /// POST /oscontent/v1/stage/slots at once, at most 1024. 0 hands out
    /// none (the routes answer 404).
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=MAX_SLOTS))]
    pub stage_slots: u32,
    /// Leases control-plane nodes may hold at once, all pools together
    /// (they also count in their pool), 1 to 1024: the default stages
    /// them one at a time.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_SLOTS))]
    pub stage_slots_control_plane: u32,
    /// How long a lease lives unless renewed (agents renew every third of
    /// it), 5 to 3600: a node that dies frees its slot within this.
    #[arg(long, default_value_t = 60, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(5..=3600))]
    pub stage_lease_ttl: u64,
    /// The Retry-After of a refused slot, 1 to 3600: each refusal gets a
    /// whole number of seconds drawn from half to one and a half times
    /// this, so refused nodes do not come back together.
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub stage_retry_after: u64,
    /// Pools the server keeps (each has its own metric series), 1 to 256:
    /// a request naming a new pool past them is refused (429, reason
    /// `pools`). Pools are counted since start.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_POOLS))]
    pub stage_max_pools: u32,
    /// Live leases one client address may hold, 1 to 1024 (429, reason
    /// `address`, past it).
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=MAX_SLOTS))]
    pub stage_leases_per_address: u32,
}

impl StageArgs {
    /// The table's configuration; `None` with `--stage-slots 0`.
    pub fn config(&self) -> Option<SlotConfig> {
        (self.stage_slots > 0).then(|| SlotConfig {
            per_pool: self.stage_slots,
            control_plane: self.stage_slots_control_plane,
            ttl: Duration::from_secs(self.stage_lease_ttl),
            retry_after: Duration::from_secs(self.stage_retry_after),
            max_pools: self.stage_max_pools,
            per_address: self.stage_leases_per_address,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        stage: StageArgs,
    }

    #[test]
    fn flags_become_the_table_config_within_their_bounds() {
        // The arguments, and the config or the flag the error names.
        type Case<'a> = (&'a [&'a str], Result<Option<SlotConfig>, &'a str>);
        let cases: &[Case<'_>] = &[
            (&[], Ok(Some(SlotConfig::default()))),
            (&["--stage-slots", "0"], Ok(None)),
            (
                &[
                    "--stage-slots=3",
                    "--stage-slots-control-plane=2",
                    "--stage-lease-ttl=5",
                    "--stage-retry-after=1",
                    "--stage-max-pools=4",
                    "--stage-leases-per-address=1",
                ],
                Ok(Some(SlotConfig {
                    per_pool: 3,
                    control_plane: 2,
                    ttl: Duration::from_secs(5),
                    retry_after: Duration::from_secs(1),
                    max_pools: 4,
                    per_address: 1,
                })),
            ),
            (&["--stage-slots", "1025"], Err("--stage-slots")),
            (
                &["--stage-slots-control-plane", "0"],
                Err("--stage-slots-control-plane"),
            ),
            (&["--stage-lease-ttl", "4"], Err("--stage-lease-ttl")),
            (&["--stage-lease-ttl", "3601"], Err("--stage-lease-ttl")),
            (&["--stage-retry-after", "0"], Err("--stage-retry-after")),
            (&["--stage-max-pools", "0"], Err("--stage-max-pools")),
            (&["--stage-max-pools", "257"], Err("--stage-max-pools")),
            (
                &["--stage-leases-per-address", "0"],
                Err("--stage-leases-per-address"),
            ),
            (&["--stage-slots=-1"], Err("--stage-slots")),
        ];
        for (args, want) in cases {
            let argv = std::iter::once("x").chain(args.iter().copied());
            match (Cli::try_parse_from(argv), want) {
                (Ok(c), Ok(w)) => assert_eq!(&c.stage.config(), w, "{args:?}"),
                (Err(e), Err(flag)) => {
                    let msg = e.to_string();
                    assert!(msg.contains(flag), "{args:?}: {msg}");
                }
                (got, want) => panic!("{args:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
