//! The admin wire's enums: each value has the one stable name the daemon writes, and a name
//! this side does not know (a newer daemon's) is kept as [`Unknown`](self) rather than
//! refused, so an older console or CLI still reads a newer daemon's answers.

/// Declares an enum whose values travel as their names, with an `Unknown(String)` fallback
/// that keeps a name it does not know as it came (and writes it back the same).
macro_rules! wire_enum {
    ($(#[$meta:meta])* pub enum $name:ident {
        $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A name this side does not know, as it came.
            Unknown(String),
        }

        impl $name {
            /// Every value this side knows, in declaration order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant),+];

            /// The name on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $text,)+
                    $name::Unknown(name) => name,
                }
            }

            /// The value a name stands for (`Unknown` for one this side does not know).
            pub fn from_name(name: &str) -> $name {
                match name {
                    $($text => $name::$variant,)+
                    other => $name::Unknown(other.to_string()),
                }
            }

            /// Whether this side knows the name.
            pub fn is_known(&self) -> bool {
                !matches!(self, $name::Unknown(_))
            }
        }

        impl From<&str> for $name {
            fn from(name: &str) -> $name {
                $name::from_name(name)
            }
        }

        /// The empty name: what records written before the field existed carry.
        impl Default for $name {
            fn default() -> $name {
                $name::Unknown(String::new())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let name = String::deserialize(d)?;
                Ok($name::from_name(&name))
            }
        }
    };
}
pub(crate) use wire_enum;

#[cfg(test)]
mod tests {
    wire_enum! {
        /// A test vocabulary.
        pub enum Colour {
            Red => "red",
            DarkBlue => "dark_blue",
        }
    }

    #[test]
    fn names_round_trip_and_an_unknown_one_is_kept_as_it_came() {
        for c in Colour::KNOWN {
            let json = serde_json::to_string(c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(&serde_json::from_str::<Colour>(&json).unwrap(), c);
        }
        let newer: Colour = serde_json::from_str("\"ultraviolet\"").unwrap();
        assert_eq!(newer, Colour::Unknown("ultraviolet".into()));
        assert!(!newer.is_known() && Colour::DarkBlue.is_known());
        assert_eq!(serde_json::to_string(&newer).unwrap(), "\"ultraviolet\"");
        assert_eq!(Colour::default().as_str(), "");
        assert_eq!(Colour::from_name("dark_blue").to_string(), "dark_blue");
    }
}
