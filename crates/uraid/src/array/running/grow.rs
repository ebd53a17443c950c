//! `grow` on the control socket (mdadm --grow): the array plans and refuses
//! (`uraid_core::array::grow_plan`); here the `--add`ed devices are checked, all of them
//! before any is written, then they join as spares and the plan is carried out.

use anyhow::{anyhow, bail};
use uraid_core::array::{grow_plan, GrowRequest, GrowSize};

use super::RunningArray;
use crate::array::member::MemberDev;

impl RunningArray {
    /// mdadm --grow [--add NEW...]: refused with nothing written, or done once the
    /// superblocks record it.
    pub fn grow(&self, mut req: GrowRequest, adds: &[String]) -> anyhow::Result<String> {
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        req.adding = adds.len();
        let room = self.room_sectors()?;
        let plan = self
            .call(move |a, _, _| {
                grow_plan(&a.grow_current(room), &req).and_then(|p| a.may_grow(&p).map(|()| p))
            })?
            .map_err(|e| anyhow!("{e}; nothing was written"))?;
        if !adds.is_empty() {
            let p = plan.clone();
            self.call(move |a, _, _| a.may_add_for_grow(&p))?
                .map_err(|e| anyhow!("{e}; nothing was written"))?;
        }
        // Every device is checked (and claimed) before the first is written.
        let joining =
            adds.iter().map(|p| self.joining(p, false, "add")).collect::<anyhow::Result<Vec<_>>>()?;
        let mut out = String::new();
        for j in joining {
            out.push_str(&self.attach(j)?);
        }
        let (done, mark) = self
            .call(move |a, _, now| a.grow(&plan, now).map(|t| (t, a.metadata_mark())))?
            .map_err(|e| anyhow!("{e}"))?;
        self.wait_metadata(mark)?;
        // Recorded: a new NBD connection may be told the new size.
        let view = self.view()?;
        self.used_dev_sectors.store(view.sb.size, std::sync::atomic::Ordering::SeqCst);
        self.device.set_size_bytes(view.array_sectors * 512);
        out.push_str(&format!("uraid: {}: {done}\n", self.name));
        Ok(out)
    }

    /// The data sectors the smallest active member has room for now (a member file may
    /// have grown since the array started): its size now less its data offset. A 1.0
    /// superblock sits at the end, so such members keep the size they have.
    fn room_sectors(&self) -> anyhow::Result<u64> {
        let view = self.view()?;
        if !matches!(view.sb.super_offset, 0 | 8) {
            return Ok(view.sb.size);
        }
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        let room = view
            .members
            .iter()
            .filter(|m| m.role.working())
            .filter_map(|m| members.get(&m.key))
            .map(|d| MemberDev::open(&d.path, false).map_or(d.dev_sectors(), |now| now.dev_sectors()))
            .map(|s| s.saturating_sub(view.sb.data_offset))
            .min();
        Ok(room.unwrap_or(view.sb.size))
    }
}

/// The server's reading of the fields: the request and the devices to add.
pub fn parse_grow_request(line: &str) -> anyhow::Result<(GrowRequest, Vec<String>)> {
    let mut req = GrowRequest::default();
    let mut adds = Vec::new();
    for field in line.split('\t').map(str::trim).filter(|f| !f.is_empty()) {
        let (key, value) = field.split_once('=').unwrap_or((field, ""));
        let number = || value.parse::<u64>().map_err(|_| anyhow!("grow: {key}={value:?} is not a number"));
        match key {
            "raid-devices" => req.raid_disks = Some(number()? as usize),
            "level" => {
                let n = number()? as i32;
                req.level = Some(
                    uraid_core::geometry::Level::from_md_level(n)
                        .ok_or_else(|| anyhow!("grow: level {n} is unknown"))?,
                )
            }
            "chunk-sectors" => req.chunk_sectors = Some(number()?),
            "layout" => req.layout = Some(value.to_string()),
            "size" if value == "max" => req.size = Some(GrowSize::Max),
            "size-sectors" => req.size = Some(GrowSize::Sectors(number()?)),
            "add" => adds.push(value.to_string()),
            "force" => req.force = true,
            other => bail!("grow: unknown field {other:?}"),
        }
    }
    Ok((req, adds))
}
