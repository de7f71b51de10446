//! `zl admin members`: the orchestrators' Raft group (docs/consensus.md). Changes go to the leader, found through
//! the node asked.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tonic::transport::Channel;
use zl_admin::pb;
use zl_admin::pb::admin_client::AdminClient;

use super::{MembersCommand, call, written};

/// How long `trim` waits for a leader, and for each removal to be taken.
const TRIM_WAIT: Duration = Duration::from_secs(120);

async fn leader_client(
    c: &mut AdminClient<Channel>,
    dir: &Path,
    node_id: &str,
) -> Result<(pb::ListMembersResponse, AdminClient<Channel>)> {
    let r = c.list_members(pb::ListMembersRequest {}).await.map_err(call)?.into_inner();
    let leader = r.members.iter().find(|m| m.leader).context("the group has no leader right now")?;
    let client = AdminClient::new(zl_admin::connect(&leader.address, dir, node_id).await?);
    Ok((r, client))
}

/// Run one `members` command against `c`.
pub(super) async fn run(
    c: &mut AdminClient<Channel>,
    dir: &Path,
    node_id: &str,
    command: MembersCommand,
) -> Result<()> {
    let (request, what) = match command {
        MembersCommand::List => {
            let r = c.list_members(pb::ListMembersRequest {}).await.map_err(call)?.into_inner();
            println!("term {}, commit index {}, applied index {}", r.term, r.commit_index, r.applied_index);
            println!("{:<8} {:<24} ROLE", "RAFT ID", "ADMIN ADDRESS");
            for m in r.members {
                let role = if m.leader {
                    "leader"
                } else if m.learner {
                    "learner"
                } else {
                    "follower"
                };
                println!("{:<8} {:<24} {role}", m.raft_id, if m.address.is_empty() { "?" } else { &m.address });
            }
            return Ok(());
        }
        MembersCommand::Trim { replicas } => return trim(c, dir, node_id, replicas).await,
        MembersCommand::Add { raft_id, address } => (
            pb::ChangeMemberRequest { raft_id, address: address.clone(), remove: false },
            format!("orchestrator {raft_id} at {address} added"),
        ),
        MembersCommand::Remove { raft_id } => (
            pb::ChangeMemberRequest { raft_id, address: String::new(), remove: true },
            format!("orchestrator {raft_id} removed"),
        ),
    };
    let (_, mut leader) = leader_client(c, dir, node_id).await?;
    written(&what, leader.change_member(request).await.map_err(call)?.into_inner());
    Ok(())
}

/// Remove every member above `replicas`, one at a time, until none is left.
async fn trim(c: &mut AdminClient<Channel>, dir: &Path, node_id: &str, replicas: u64) -> Result<()> {
    let deadline = Instant::now() + TRIM_WAIT;
    // After the first round, ask the leader found last: the node first asked may be one of those removed (it then
    // no longer hears of a leader).
    let mut last_leader: Option<AdminClient<Channel>> = None;
    loop {
        let attempt = async {
            let (members, mut leader) = match last_leader.take() {
                Some(mut l) => match leader_client(&mut l, dir, node_id).await {
                    Ok(found) => found,
                    Err(_) => leader_client(c, dir, node_id).await?,
                },
                None => leader_client(c, dir, node_id).await?,
            };
            last_leader = Some(leader.clone());
            let Some(gone) = members.members.iter().map(|m| m.raft_id).filter(|&id| id > replicas).max() else {
                return Ok(None);
            };
            let request = pb::ChangeMemberRequest { raft_id: gone, address: String::new(), remove: true };
            let r = leader.change_member(request).await.map_err(call)?.into_inner();
            written(&format!("orchestrator {gone} removed"), r);
            anyhow::Ok(Some(gone))
        };
        match attempt.await {
            Ok(None) => {
                println!("the group's members are Raft ids 1 to {replicas} at most");
                return Ok(());
            }
            Ok(Some(_)) => continue,
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting: {e:#}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => bail!("trimming the group to {replicas}: {e:#}"),
        }
    }
}
