//! Shard rebalancing: the live relays share the shards fairly, one owner per shard.
//!
//! [`plan`] decides, from what the session sees, which shards to give back or to try to take;
//! [`rebalance`] reads the cluster through the session and carries the decision out.

use std::collections::BTreeSet;

use tracing::info;

use crate::error::Result;
use crate::store::{ClusterView, ShardSession};

/// What a relay does with its shards to hold its fair share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Move {
    /// It holds its share: nothing to do.
    Stay,
    /// Give these shards back (the highest owned): the excess over the share.
    Release(Vec<i32>),
    /// Try to take these free shards, in this order, until `share` shards are owned.
    Acquire { share: usize, candidates: Vec<i32> },
}

/// A relay's fair share of `shards` shards: `ceil(shards / live_relays)`, counting at least
/// one relay (this one).
pub(super) fn fair_share(shards: u32, live_relays: u32) -> usize {
    shards.div_ceil(live_relays.max(1)) as usize
}

/// Where a relay starts looking for free shards, from its name: relays starting together do
/// not all race for shard 0.
pub(super) fn acquire_offset(relay_id: &str) -> u32 {
    relay_id
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
}

/// Take free shards up to the fair share (starting at `acquire_offset`, passing over every locked
/// shard, this relay's included), give back what is above it.
pub(super) fn plan(
    shards: u32,
    view: &ClusterView,
    owned: &BTreeSet<i32>,
    acquire_offset: u32,
) -> Move {
    let share = fair_share(shards, view.live_relays);
    let held = owned.len();
    if held > share {
        Move::Release(owned.iter().rev().take(held - share).copied().collect())
    } else if held < share && shards > 0 {
        let candidates = (0..shards)
            .map(|i| (acquire_offset.wrapping_add(i) % shards) as i32)
            .filter(|shard| !view.locked.contains(shard))
            .collect();
        Move::Acquire { share, candidates }
    } else {
        Move::Stay
    }
}

/// Read the cluster through `session`, then give shards back or take free ones (see
/// [`plan`]). Returns how many shards were given back.
pub(super) async fn rebalance(
    session: &mut dyn ShardSession,
    acquire_offset: u32,
) -> Result<usize> {
    let view = session.cluster().await?;
    match plan(
        session.shard_count(),
        &view,
        session.owned(),
        acquire_offset,
    ) {
        Move::Stay => Ok(0),
        Move::Release(excess) => {
            for &shard in &excess {
                session.release(shard).await?;
            }
            info!(
                released = excess.len(),
                owned = session.owned().len(),
                relays = view.live_relays,
                "gave shards back to other relays"
            );
            Ok(excess.len())
        }
        Move::Acquire { share, candidates } => {
            let mut got = 0;
            for shard in candidates {
                if session.owned().len() >= share {
                    break;
                }
                if session.try_acquire(shard).await? {
                    got += 1;
                }
            }
            if got > 0 {
                info!(
                    acquired = got,
                    owned = session.owned().len(),
                    relays = view.live_relays,
                    "took over free shards"
                );
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn view(live_relays: u32, locked: &[i32]) -> ClusterView {
        ClusterView {
            live_relays,
            locked: locked.iter().copied().collect(),
        }
    }

    fn set(shards: impl IntoIterator<Item = i32>) -> BTreeSet<i32> {
        shards.into_iter().collect()
    }

    #[test]
    fn the_fair_share_is_the_ceiling_and_counts_this_relay() {
        assert_eq!(fair_share(16, 3), 6);
        assert_eq!(fair_share(16, 4), 4);
        assert_eq!(fair_share(5, 10), 1);
        assert_eq!(fair_share(16, 1), 16);
        assert_eq!(fair_share(16, 0), 16, "no relay seen: this one counts");
        assert_eq!(fair_share(0, 2), 0);
    }

    #[test]
    fn the_excess_is_given_back_highest_shards_first() {
        let owned = set(0..8);
        assert_eq!(
            plan(16, &view(3, &[]), &owned, 0),
            Move::Release(vec![7, 6])
        );
        assert_eq!(
            plan(16, &view(16, &[]), &owned, 0),
            Move::Release(vec![7, 6, 5, 4, 3, 2, 1])
        );
    }

    #[test]
    fn free_shards_are_tried_from_the_offset_past_locked_ones() {
        let owned = set([1]);
        assert_eq!(
            plan(8, &view(2, &[1, 5]), &owned, 6),
            Move::Acquire {
                share: 4,
                candidates: vec![6, 7, 0, 2, 3, 4]
            }
        );
        // The offset wraps around the shard count, whatever its size.
        assert_eq!(
            plan(4, &view(1, &[]), &set([]), u32::MAX),
            Move::Acquire {
                share: 4,
                candidates: vec![3, 0, 1, 2]
            }
        );
    }

    #[test]
    fn a_relay_at_its_share_or_without_shards_stays() {
        assert_eq!(plan(8, &view(2, &[0, 1, 2, 3]), &set(0..4), 0), Move::Stay);
        assert_eq!(plan(0, &view(1, &[]), &set([]), 0), Move::Stay);
    }

    #[tokio::test]
    async fn a_second_session_gets_half_the_shards() {
        let store = crate::memory::MemoryStore::new(8);
        let mut a = store.open_session("relay-a").await.unwrap();
        assert_eq!(rebalance(a.as_mut(), 0).await.unwrap(), 0);
        assert_eq!(a.owned(), &set(0..8));
        let mut b = store.open_session("relay-b").await.unwrap();
        assert_eq!(rebalance(b.as_mut(), 0).await.unwrap(), 0);
        assert!(b.owned().is_empty(), "every shard is taken");
        assert_eq!(rebalance(a.as_mut(), 0).await.unwrap(), 4);
        assert_eq!(a.owned(), &set(0..4));
        assert_eq!(rebalance(b.as_mut(), 0).await.unwrap(), 0);
        assert_eq!(b.owned(), &set(4..8));
    }

    #[test]
    fn the_acquire_offset_hashes_the_relay_id() {
        assert_eq!(acquire_offset(""), 0);
        assert_eq!(acquire_offset("a"), 97);
        assert_eq!(acquire_offset("ab"), 97 * 31 + 98);
        assert_ne!(acquire_offset("relay-1"), acquire_offset("relay-2"));
    }
}
