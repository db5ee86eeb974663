//! What every accepted cloud-config request must satisfy, shared by the fuzz targets: its names
//! are valid Kubernetes names, and it reads back the same from a canonical JSON body and query.

use harvester_cloud::{
    kubeconfig::{AccountRequest, OutputFormat, request},
    validation,
};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

pub fn check_accepted(req: &AccountRequest) {
    assert!(
        validation::dns1123_label(&req.namespace).is_ok(),
        "accepted an invalid namespace {:?}",
        req.namespace
    );
    assert!(
        validation::dns1123_subdomain(&req.service_account).is_ok(),
        "accepted an invalid service account name {:?}",
        req.service_account
    );
    let output = match req.output {
        OutputFormat::CloudInit => "yaml",
        OutputFormat::Kubeconfig => "",
    };
    let body = serde_json::json!({
        "namespace": req.namespace,
        "serviceAccountName": req.service_account,
        "outputFormat": output,
    })
    .to_string();
    assert_eq!(
        request::from_json(body.as_bytes()).as_ref(),
        Ok(req),
        "{body}"
    );
    let enc = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
    let query = format!(
        "namespace={}&serviceAccountName={}&outputFormat={}",
        enc(&req.namespace),
        enc(&req.service_account),
        output
    );
    assert_eq!(
        request::from_query(Some(&query)).as_ref(),
        Ok(req),
        "{query}"
    );
}
