//! Kubernetes: `llmslo inject` (the sidecar added to a manifest) and the admission webhook
//! that does the same to pods as they are created.

pub mod inject;
pub mod webhook;
