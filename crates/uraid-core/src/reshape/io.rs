//! Client reads of an array md left mid-reshape: each piece goes to the member and device
//! sector its side of `reshape_position` gives (md's make_stripe_request with `previous`).
//! A degraded reshape is refused here (served writable it goes on: `array::reshape_ops`), so a read is a member
//! read; a member read error fails the request instead of reconstructing across layouts.

use crate::api::*;
use crate::engine::Mddev;
use crate::ledger::{IoCtx, Ledger};
use crate::reshape::ReshapeGeometry;

impl Mddev {
    pub(crate) fn set_reshape(&mut self, reshape: ReshapeGeometry) -> Result<(), String> {
        if !self.is_read_only() {
            return Err(super::unsupported("writing to an array mid-reshape"));
        }
        if reshape.next != self.geo {
            return Err("the reshape's new layout is not the engine's geometry".into());
        }
        if self.is_degraded() {
            return Err(super::unsupported("a degraded reshape"));
        }
        self.reshape = Some(Box::new(reshape));
        Ok(())
    }

    pub(crate) fn reshape_read(&mut self, led: &mut Ledger, id: RequestId, sector: u64, len: u64) {
        let r = self.reshape.as_deref().expect("a reshape");
        let pieces = r.map_range(sector, len, r.position_sectors);
        for (pos, e) in pieces {
            led.reqs.get_mut(&id).expect("request").parts += 1;
            let dest_off = ((pos - sector) * SECTOR_BYTES) as usize;
            let ctx = IoCtx::ReshapeRead { req: id, len_sectors: e.len_sectors, dest_off };
            self.issue_raw_read(led, e.member, e.device_sector * SECTOR_BYTES, e.len_sectors, ctx);
        }
    }

    pub(crate) fn reshape_read_done(
        &mut self,
        led: &mut Ledger,
        req: RequestId,
        member: usize,
        len_sectors: u64,
        dest_off: usize,
        result: MemberIoResult,
    ) {
        match result {
            Ok(data) => {
                self.read_part_done(led, req, dest_off, len_sectors, data);
            }
            Err(e) => {
                if e == MemberIoError::Gone {
                    self.fail_member(led, member, self.now_ns);
                }
                self.part_done(led, req, Some(RequestError::Io));
            }
        }
    }
}
