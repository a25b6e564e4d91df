//! The environment a task of an elastic job gets, computed from the request and the
//! job id; pure so it is unit-tested here and merely applied by the FFI layer.

use bftrainer_core::spec::{env, ElasticSpec, Role};

/// `(name, value)` pairs for bft-run, in a fixed order.
pub fn task_env(spec: &ElasticSpec, job_id: Option<u32>) -> Vec<(&'static str, String)> {
    let mut out = vec![
        (env::SPEC, spec.to_string()),
        (env::MIN, spec.min.to_string()),
        (env::ROLE, spec.role.to_string()),
    ];
    if let Some(max) = spec.max {
        out.push((env::MAX, max.to_string()));
    }
    let parent = match spec.role {
        Role::Core => job_id,
        Role::Satellite => spec.parent,
    };
    if let Some(p) = parent {
        out.push((env::PARENT_JOB_ID, p.to_string()));
    }
    if let Some(v) = spec.up {
        out.push((env::UP_SECONDS, v.to_string()));
    }
    if let Some(v) = spec.down {
        out.push((env::DOWN_SECONDS, v.to_string()));
    }
    if let Some(v) = &spec.profile {
        out.push((env::PROFILE, v.clone()));
    }
    if let Some((lo, hi)) = spec.batch {
        out.push((env::BATCH_MIN, lo.to_string()));
        out.push((env::BATCH_MAX, hi.to_string()));
    }
    if let Some(v) = spec.lr {
        out.push((env::LR_RULE, v.as_str().to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bftrainer_core::spec::parse;

    #[test]
    fn core_job() {
        let e = task_env(&parse("2:4,up=30,profile=bert").unwrap(), Some(41));
        assert_eq!(
            e,
            vec![
                ("BFT_ELASTIC", "2:4,up=30,profile=bert".to_string()),
                ("BFT_ELASTIC_MIN", "2".into()),
                ("BFT_ROLE", "core".into()),
                ("BFT_ELASTIC_MAX", "4".into()),
                ("BFT_PARENT_JOB_ID", "41".into()),
                ("BFT_UP_SECONDS", "30".into()),
                ("BFT_PROFILE", "bert".into()),
            ]
        );
    }

    #[test]
    fn satellite_points_at_its_parent() {
        let e = task_env(
            &parse("1:1,role=satellite,parent=7,down=3").unwrap(),
            Some(99),
        );
        assert!(e.contains(&("BFT_PARENT_JOB_ID", "7".into())));
        assert!(e.contains(&("BFT_ROLE", "satellite".into())));
        assert!(e.contains(&("BFT_DOWN_SECONDS", "3".into())));
        let b = task_env(&parse("1:8,batch=256:4096,lr=sqrt").unwrap(), Some(5));
        assert!(b.contains(&("BFT_BATCH_MIN", "256".into())));
        assert!(b.contains(&("BFT_BATCH_MAX", "4096".into())));
        assert!(b.contains(&("BFT_LR_RULE", "sqrt".into())));
        let open = task_env(&parse("3").unwrap(), None);
        assert!(!open
            .iter()
            .any(|(k, _)| *k == "BFT_ELASTIC_MAX" || *k == "BFT_PARENT_JOB_ID"));
    }
}
