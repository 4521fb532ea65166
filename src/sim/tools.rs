//! Forced tool calls: which tool a request forces, in each API's own request shape, and the
//! deterministic argument text the simulated model "writes" for it, token by token.
//!
//! A request forces a call when it sends a non-empty `tools` list together with a forcing
//! `tool_choice`: chat `"required"` or `{"type":"function","function":{"name"}}`, Responses
//! `"required"` or `{"type":"function","name"}`, Messages `{"type":"any"}` or
//! `{"type":"tool","name"}`. `"auto"` (or no `tool_choice`) gets plain text: the simulator does not
//! decide by itself to call a tool.
//!
//! Token 0 of a forced call carries the tool's name; each later token carries one piece of the
//! arguments: `{"<first parameter>": "`, then one filler word per token, and the sequence's last
//! token closes the object (`"}`, or `{}` when it is the first argument token). So whatever the
//! length, the arguments of a finished call are valid JSON, and the number of events equals the
//! number of tokens.

use serde_json::Value;

use super::prompt::token_text;

/// The tool a request forces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForcedTool {
    /// The function's name.
    pub name: String,
    /// The first property of its parameter schema (`"input"` when it declares none).
    pub arg: String,
}

/// Which request shape the tools come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolShape {
    /// `tools: [{"type":"function","function":{"name","parameters"}}]`.
    Chat,
    /// `tools: [{"type":"function","name","parameters"}]`.
    Responses,
    /// `tools: [{"name","input_schema"}]`.
    Messages,
}

/// The forced tool of a request, or `None` when it asks for none (or lets the model choose).
pub fn forced(obj: &serde_json::Map<String, Value>, shape: ToolShape) -> Option<ForcedTool> {
    let tools = obj.get("tools")?.as_array().filter(|t| !t.is_empty())?;
    // (name, parameter schema) of each tool, in this API's shape.
    let fields = |t: &Value| -> Option<(String, Option<Value>)> {
        let (f, schema_key) = match shape {
            ToolShape::Chat => (t.get("function")?, "parameters"),
            ToolShape::Responses => (t, "parameters"),
            ToolShape::Messages => (t, "input_schema"),
        };
        Some((
            f.get("name")?.as_str()?.to_string(),
            f.get(schema_key).cloned(),
        ))
    };
    let choice = obj.get("tool_choice")?;
    let wanted: Option<&str> = match (shape, choice) {
        (ToolShape::Chat | ToolShape::Responses, Value::String(s)) if s == "required" => None,
        (ToolShape::Chat, Value::Object(o)) if o.get("type")? == "function" => {
            Some(o.get("function")?.get("name")?.as_str()?)
        }
        (ToolShape::Responses, Value::Object(o)) if o.get("type")? == "function" => {
            Some(o.get("name")?.as_str()?)
        }
        (ToolShape::Messages, Value::Object(o)) if o.get("type")? == "any" => None,
        (ToolShape::Messages, Value::Object(o)) if o.get("type")? == "tool" => {
            Some(o.get("name")?.as_str()?)
        }
        _ => return None,
    };
    let (name, schema) = tools
        .iter()
        .filter_map(fields)
        .find(|(n, _)| wanted.is_none_or(|w| w == n))?;
    let arg = schema
        .as_ref()
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .and_then(|p| p.keys().next().cloned())
        .unwrap_or_else(|| "input".to_string());
    Some(ForcedTool { name, arg })
}

impl ForcedTool {
    /// The argument text carried by token `index`, `last` when it ends the sequence (token 0
    /// carries the name and no argument text).
    pub fn piece(&self, index: u64, last: bool) -> String {
        match (index, last) {
            (0, _) => String::new(),
            (1, true) => "{}".to_string(),
            (_, true) => "\"}".to_string(),
            (1, false) => format!("{{{}: \"", json_str(&self.arg)),
            (i, false) => token_text(i - 2).to_string(),
        }
    }

    /// The whole argument text after `tokens` tokens (the last of them ended the sequence).
    pub fn arguments(&self, tokens: u64) -> String {
        (1..tokens)
            .map(|i| self.piece(i, i + 1 == tokens))
            .collect()
    }
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(s: &str) -> serde_json::Map<String, Value> {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn forcing_choices_in_each_shape() {
        let chat = r#"{"tools":[{"type":"function","function":{"name":"a","parameters":{"properties":{"p":{}}}}},{"type":"function","function":{"name":"b"}}],"tool_choice":{"type":"function","function":{"name":"b"}}}"#;
        assert_eq!(
            forced(&obj(chat), ToolShape::Chat),
            Some(ForcedTool {
                name: "b".into(),
                arg: "input".into()
            })
        );
        let req = r#"{"tools":[{"type":"function","name":"a","parameters":{"properties":{"path":{}}}}],"tool_choice":"required"}"#;
        assert_eq!(
            forced(&obj(req), ToolShape::Responses).map(|t| t.arg),
            Some("path".into())
        );
        let auto = r#"{"tools":[{"type":"function","name":"a"}],"tool_choice":"auto"}"#;
        assert_eq!(forced(&obj(auto), ToolShape::Responses), None);
        let any = r#"{"tools":[{"name":"a","input_schema":{"properties":{"q":{}}}}],"tool_choice":{"type":"any"}}"#;
        assert_eq!(
            forced(&obj(any), ToolShape::Messages).map(|t| t.name),
            Some("a".into())
        );
        let none = r#"{"tools":[],"tool_choice":"required"}"#;
        assert_eq!(forced(&obj(none), ToolShape::Chat), None);
    }

    #[test]
    fn arguments_are_json_at_any_length() {
        let t = ForcedTool {
            name: "read_file".into(),
            arg: "path".into(),
        };
        assert_eq!(t.arguments(1), "");
        for k in 2..12 {
            let a = t.arguments(k);
            let v: Value = serde_json::from_str(&a).unwrap_or_else(|e| panic!("{a}: {e}"));
            assert!(v.is_object(), "{a}");
        }
        assert_eq!(t.arguments(4), "{\"path\": \" token\"}");
    }
}
