//! The `tenant` label, on the families that carry one (requests, tokens, SLO events, goodput,
//! cost): present only when tenants are configured, so that without them every series is
//! exactly as it was.

use crate::record::LabelText;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};

/// A series' tenant, or no `tenant` label at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantLabel(pub Option<LabelText>);

impl EncodeLabelSet for TenantLabel {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        match &self.0 {
            Some(tenant) => [("tenant", tenant.as_str())].encode(encoder),
            None => Ok(()),
        }
    }
}
